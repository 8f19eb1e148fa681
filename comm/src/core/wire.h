// Fixed-size fields of comm's wire formats (store, parameter server, records): integers in host
// byte order, since every rank of a job runs the same architecture.
#pragma once

#include <cstring>
#include <string>

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

}  // namespace mltrain::comm::detail::wire
