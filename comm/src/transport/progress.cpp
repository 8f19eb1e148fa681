#include "transport/progress.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "core/sys_check.h"
#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

namespace {

void throw_if_gone(std::span<Link* const> links, bool (Link::*can_move)()) {
  for (Link* l : links)
    if (l != nullptr && !(l->*can_move)() && !l->peer_alive())
      throw Error(Error::Kind::peer_closed, l->peer_label() + ": its process is gone", l->peer_rank(),
                  l->peer_host());
}

}  // namespace

bool ProgressWait::add(Link* l, short events) {
  if (l->fd() < 0) return false;
  for (pollfd& p : fds_)
    if (p.fd == l->fd()) {
      p.events |= events;
      return true;
    }
  fds_.push_back({l->fd(), events, 0});
  return true;
}

void ProgressWait::wait(std::span<Link* const> tx, std::span<Link* const> rx, Bell* bell, int cap_ms) {
  fds_.clear();
  bool any_shm = false, any_want = false;
  for (std::size_t ch = 0; ch < tx.size(); ++ch) {
    if (tx[ch] != nullptr) any_want = true, any_shm |= !add(tx[ch], POLLOUT);
    if (rx[ch] != nullptr) any_want = true, any_shm |= !add(rx[ch], POLLIN);
  }
  if (!any_want) {
    sched_yield();
  } else if (!fds_.empty() && any_shm) {
    const timespec ts{0, mixed_wait_us_ * 1000};
    if (::ppoll(fds_.data(), fds_.size(), &ts, nullptr) < 0 && errno != EINTR)
      throw_sys("ppoll", "waiting on " + std::to_string(fds_.size()) + " links");
    mixed_wait_us_ = std::min<long>(mixed_wait_us_ * 2, 1000);
  } else if (!fds_.empty()) {
    if (::poll(fds_.data(), fds_.size(), cap_ms) < 0 && errno != EINTR)
      throw_sys("poll", "waiting on " + std::to_string(fds_.size()) + " links");
  } else if (bell != nullptr) {
    bell->waiters.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t seen = bell->seq.load(std::memory_order_seq_cst);
    bool ready = false;
    for (std::size_t ch = 0; !ready && ch < tx.size(); ++ch)
      ready = (tx[ch] && tx[ch]->can_send()) || (rx[ch] && rx[ch]->can_recv());
    if (!ready) sleep_on_bell(bell, seen, cap_ms);
    bell->waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
  throw_if_gone(rx, &Link::can_recv);
  throw_if_gone(tx, &Link::can_send);
}

}  // namespace mltrain::comm::detail
