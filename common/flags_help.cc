#include "common/flags_help.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "common/version.h"

namespace paramd {

void HandleHelpFlag(int argc, char** argv) {
  bool help = false;
  bool version = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    help = help || arg == "--help" || arg == "-help" || arg == "--helpfull" || arg == "-h";
    version = version || arg == "--version";
  }
  if (version && !help) {
    std::string_view program = argc > 0 ? argv[0] : "paramd";
    if (const size_t slash = program.rfind('/'); slash != std::string_view::npos) {
      program.remove_prefix(slash + 1);
    }
    std::printf("%s %s\n", std::string(program).c_str(), std::string(Version()).c_str());
    std::fflush(stdout);
    std::exit(0);
  }
  if (!help) return;
  std::printf("%s\n\nFlags:\n", std::string(absl::ProgramUsageMessage()).c_str());
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    // Abseil's own (--flagfile, --fromenv, ...) and GoogleTest's are not this program's.
    const std::string file = flag->Filename();
    if (file.find("absl/") != std::string::npos) continue;
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  for (const absl::CommandLineFlag* flag : flags) {
    std::printf("  --%s  %s (default: \"%s\")\n", std::string(flag->Name()).c_str(),
                flag->Help().c_str(), flag->DefaultValue().c_str());
  }
  std::fflush(stdout);
  std::exit(0);
}

}  // namespace paramd
