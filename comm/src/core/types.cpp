// Names and sizes of the public enums, and the Error type.
#include <array>

#include "mltrain/comm.hpp"

namespace mltrain::comm {

namespace {
constexpr std::array<std::string_view, 7> kDtypeNames{"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
constexpr std::array<std::size_t, 7> kDtypeSizes{4, 8, 2, 2, 4, 8, 1};
constexpr std::array<std::string_view, 5> kOpNames{"sum", "prod", "min", "max", "avg"};
constexpr std::array<std::string_view, 5> kAlgoNames{"auto", "ring", "bidir", "hd", "direct"};
}  // namespace

std::size_t size_of(DataType dtype) { return kDtypeSizes.at(static_cast<std::size_t>(dtype)); }
std::string_view name_of(DataType dtype) { return kDtypeNames.at(static_cast<std::size_t>(dtype)); }
std::string_view name_of(ReduceOp op) { return kOpNames.at(static_cast<std::size_t>(op)); }
std::string_view name_of(Algo algo) { return kAlgoNames.at(static_cast<std::size_t>(algo)); }
std::string_view name_of(Backend backend) {
  return backend == Backend::nccl ? "nccl" : backend == Backend::tcp ? "tcp" : "auto";
}

std::optional<DataType> parse_dtype(std::string_view text) {
  for (std::size_t i = 0; i < kDtypeNames.size(); ++i)
    if (text == kDtypeNames[i]) return static_cast<DataType>(i);
  if (text == "float" || text == "float32") return DataType::f32;
  if (text == "double" || text == "float64") return DataType::f64;
  if (text == "half" || text == "float16") return DataType::f16;
  if (text == "int32") return DataType::i32;
  if (text == "int64") return DataType::i64;
  if (text == "uint8") return DataType::u8;
  return std::nullopt;
}

std::optional<ReduceOp> parse_redop(std::string_view text) {
  for (std::size_t i = 0; i < kOpNames.size(); ++i)
    if (text == kOpNames[i]) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

Error::Error(Kind kind, const std::string& what, int peer_rank, std::string peer_host)
    : std::runtime_error(what), kind_(kind), peer_rank_(peer_rank), peer_host_(std::move(peer_host)) {}

}  // namespace mltrain::comm
