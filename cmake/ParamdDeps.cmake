# The service's dependencies. gRPC's CMake config also checks its plugin binaries
# (protobuf-compiler-grpc); protobuf 3.21 has no config, CMake's FindProtobuf finds it.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
