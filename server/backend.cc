#include "server/backend.h"

#include "absl/strings/str_cat.h"

namespace paramd {

std::string FormatName(const FormatKey& format) {
  std::string recipe = v1::Recipe_Name(format.recipe);
  recipe = recipe.substr(recipe.find('_') + 1);  // RECIPE_BF16 -> BF16
  for (char& c : recipe) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return format.direction == v1::DIRECTION_COLUMNWISE ? absl::StrCat(recipe, "/columnwise")
                                                      : recipe;
}

int64_t ServedElementBytes(v1::Recipe recipe) {
  switch (recipe) {
    case v1::RECIPE_FP32:
      return 4;
    case v1::RECIPE_BF16:
    case v1::RECIPE_FP16:
      return 2;
    default:
      return 1;
  }
}

const std::vector<uint8_t>* ServedTensor::Find(const FormatKey& format) const {
  for (const auto& [key, bytes] : formats) {
    if (key == format) return &bytes;
  }
  return nullptr;
}

int64_t ServedTensor::bytes() const {
  int64_t total = 0;
  for (const auto& entry : formats) total += static_cast<int64_t>(entry.second.size());
  return total;
}

}  // namespace paramd
