// The patterns' option names, as the Python package spells them, and their parsing with the
// messages of its ValueErrors.
#include <string>
#include <string_view>

#include "patterns/pattern_names.h"

namespace attn2d {
namespace {

constexpr const char* kMetricNames[] = {"chebyshev", "manhattan", "euclidean"};
constexpr const char* kBorderNames[] = {"clip", "shift"};
constexpr const char* kKindNames[] = {"rtl-floor", "rtl-repetitive", "ltr-floor",
                                      "ltr-repetitive"};
constexpr const char* kMappingNames[] = {"official", "geometric"};

template <size_t N>
const char* name_of(const char* const (&names)[N], int value) {
  return value >= 0 && value < static_cast<int>(N) ? names[value] : "unknown";
}

// repr() of a Python str: single quotes unless the text holds one and no double quote.
std::string python_repr(std::string_view text) {
  const bool double_quotes = text.find('\'') != std::string_view::npos &&
                             text.find('"') == std::string_view::npos;
  const char quote = double_quotes ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : text) {
    if (c == '\\' || c == quote) out += '\\';
    out += c;
  }
  return out + quote;
}

// repr() of a Python tuple of str: "('a', 'b')".
template <size_t N>
std::string python_tuple(const char* const (&names)[N]) {
  std::string out = "(";
  for (size_t i = 0; i < N; ++i) out += (i ? ", " : "") + python_repr(names[i]);
  return out + ")";
}

template <typename Enum, size_t N>
bool parse(const char* const (&names)[N], std::string_view name, Enum* value) {
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i]) {
      *value = static_cast<Enum>(i);
      return true;
    }
  }
  return false;
}

template <size_t N>
bool in_range(const char* const (&)[N], int value) {
  return value >= 0 && value < static_cast<int>(N);
}

}  // namespace

const char* window_metric_name(WindowMetric metric) {
  return name_of(kMetricNames, static_cast<int>(metric));
}
const char* window_border_name(WindowBorder border) {
  return name_of(kBorderNames, static_cast<int>(border));
}
const char* ylg_kind_name(YlgKind kind) { return name_of(kKindNames, static_cast<int>(kind)); }
const char* ylg_mapping_name(YlgMapping mapping) {
  return name_of(kMappingNames, static_cast<int>(mapping));
}

Status parse_window_metric(std::string_view name, WindowMetric* metric) {
  if (parse(kMetricNames, name, metric)) return Status::Ok();
  return Status::InvalidArgument("attn2d.patterns.Window: metric must be one of " +
                                 python_tuple(kMetricNames) + "; got " + python_repr(name));
}

Status parse_window_border(std::string_view name, WindowBorder* border) {
  if (parse(kBorderNames, name, border)) return Status::Ok();
  return Status::InvalidArgument("attn2d.patterns.Window: border must be one of " +
                                 python_tuple(kBorderNames) + "; got " + python_repr(name));
}

Status parse_ylg_kind(std::string_view name, YlgKind* kind) {
  if (parse(kKindNames, name, kind)) return Status::Ok();
  return Status::InvalidArgument("attn2d.patterns.YLG: unknown pattern " + python_repr(name) +
                                 "; choose from " + python_tuple(kKindNames));
}

Status parse_ylg_mapping(std::string_view name, YlgMapping* mapping) {
  if (parse(kMappingNames, name, mapping)) return Status::Ok();
  return Status::InvalidArgument(
      "attn2d.patterns.YLG: mapping must be 'official' or 'geometric'; got " + python_repr(name));
}

namespace patterns {

Status check_option(WindowMetric metric) {
  if (in_range(kMetricNames, static_cast<int>(metric))) return Status::Ok();
  return Status::InvalidArgument("attn2d.patterns.Window: metric must be one of " +
                                 python_tuple(kMetricNames) + "; got WindowMetric(" +
                                 std::to_string(static_cast<int>(metric)) + ")");
}

Status check_option(WindowBorder border) {
  if (in_range(kBorderNames, static_cast<int>(border))) return Status::Ok();
  return Status::InvalidArgument("attn2d.patterns.Window: border must be one of " +
                                 python_tuple(kBorderNames) + "; got WindowBorder(" +
                                 std::to_string(static_cast<int>(border)) + ")");
}

Status check_option(YlgKind kind) {
  if (in_range(kKindNames, static_cast<int>(kind))) return Status::Ok();
  return Status::InvalidArgument("attn2d.patterns.YLG: unknown pattern YlgKind(" +
                                 std::to_string(static_cast<int>(kind)) + "); choose from " +
                                 python_tuple(kKindNames));
}

Status check_option(YlgMapping mapping) {
  if (in_range(kMappingNames, static_cast<int>(mapping))) return Status::Ok();
  return Status::InvalidArgument(
      "attn2d.patterns.YLG: mapping must be 'official' or 'geometric'; got YlgMapping(" +
      std::to_string(static_cast<int>(mapping)) + ")");
}

}  // namespace patterns
}  // namespace attn2d
