// Fixed-size fields of comm's wire formats (store, parameter server, records): integers in host
// byte order, since every rank of a job runs the same architecture.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mltrain::comm::detail::wire {

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A string field: its u32 length, then its bytes.
inline void put_text(std::string& out, std::string_view text) {
  put(out, static_cast<std::uint32_t>(text.size()));
  out.append(text);
}

// Reads fields off a received buffer; a short buffer or a string over its bound makes ok() false
// (and every later read return zeros), so a decoder checks once, at the end.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  template <class T>
  T get() {
    if (!take(sizeof(T))) return T{};
    return wire::get<T>(data_.data() + pos_ - sizeof(T));
  }
  std::string text(std::size_t max) {
    const auto n = get<std::uint32_t>();
    if (n > max || !take(n)) return (ok_ = false), std::string();
    return std::string(data_.substr(pos_ - n, n));
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == data_.size(); }

 private:
  bool take(std::size_t n) {
    if (!ok_ || data_.size() - pos_ < n) return ok_ = false;
    pos_ += n;
    return true;
  }
  std::string_view data_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace mltrain::comm::detail::wire
