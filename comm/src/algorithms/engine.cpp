#include "algorithms/engine.h"

#include <algorithm>
#include <cstring>
#include <poll.h>
#include <sched.h>

#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

namespace {

const std::byte kZeros[8] = {};

std::string seconds_text(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

void run_steps(std::vector<Step>& steps, const EngineConfig& cfg) {
  const std::size_t n_steps = steps.size();
  std::size_t si = 0, so = 0, spad = 0;
  std::size_t ri = 0, ro = 0, rpad = 0;
  bool send_started = false, recv_started = false;
  Clock::time_point idle_since{};
  bool idle = false;
  unsigned idle_loops = 0;
  long mixed_wait_us = 20;  // TCP and shm at once: poll the socket, re-check the ring, backing off
  const auto spin = std::chrono::microseconds(cfg.spin_us);

  while (si < n_steps || ri < n_steps) {
    bool progress = false;
    Link* tx_want = nullptr;
    Link* rx_want = nullptr;

    // Send side: at most one piece per pass, so receives interleave.
    while (si < n_steps) {
      Step& s = steps[si];
      if (s.tx == nullptr) {
        ++si;
        send_started = false;
        continue;
      }
      if (!send_started) {
        spad = s.align ? (8 - s.tx->tx_pos() % 8) % 8 : 0;
        so = 0;
        send_started = true;
      }
      if (spad > 0) {
        const std::size_t k = s.tx->send_some(kZeros, spad);
        spad -= k;
        progress |= k > 0;
        if (spad > 0) {
          tx_want = s.tx;
          break;
        }
      }
      std::size_t limit = s.send_bytes;
      if (s.send_dep >= 0) {
        const auto dep = static_cast<std::size_t>(s.send_dep);
        if (ri < dep) limit = 0;
        else if (ri == dep) limit = std::min(limit, ro);
      }
      if (so == s.send_bytes) {
        ++si;
        send_started = false;
        continue;
      }
      if (so >= limit) break;  // waits on a receive
      const std::size_t k = s.tx->send_some(static_cast<const std::byte*>(s.send) + so,
                                            std::min(limit - so, s.tx->piece_bytes(cfg.piece)));
      so += k;
      progress |= k > 0;
      if (so == s.send_bytes) {
        ++si;
        send_started = false;
        continue;
      }
      if (k == 0) tx_want = s.tx;
      break;
    }

    // Receive side: copy or reduce straight out of the link's buffer.
    while (ri < n_steps) {
      Step& s = steps[ri];
      if (s.rx == nullptr) {
        ++ri;
        recv_started = false;
        continue;
      }
      if (!recv_started) {
        rpad = s.align ? (8 - s.rx->rx_pos() % 8) % 8 : 0;
        ro = 0;
        recv_started = true;
      }
      if (rpad > 0) {
        const auto view = s.rx->peek();
        const std::size_t k = std::min(view.size(), rpad);
        if (k > 0) {
          s.rx->consume(k);
          rpad -= k;
          progress = true;
        }
        if (rpad > 0) {
          rx_want = s.rx;
          break;
        }
      }
      if (ro == s.recv_bytes) {
        if (s.header && cfg.on_header) cfg.on_header(ri);
        ++ri;
        recv_started = false;
        continue;
      }
      std::size_t limit = s.recv_bytes;
      if (s.recv_dep >= 0) {  // do not overwrite bytes still to be sent
        const auto dep = static_cast<std::size_t>(s.recv_dep);
        if (si < dep) limit = 0;
        else if (si == dep) limit = std::min(limit, so);
      }
      if (ro >= limit) break;  // waits on a send
      auto* dst = static_cast<std::byte*>(s.recv) + ro;
      std::size_t n = 0;
      if (s.reduce) {
        const auto view = s.rx->peek();
        n = std::min({view.size(), limit - ro, s.rx->piece_bytes(cfg.piece)});
        n -= n % cfg.elem;
        if (n > 0) {
          cfg.reduce(dst, static_cast<const std::byte*>(s.own) + ro, view.data(), n / cfg.elem);
          if (s.finalize) cfg.finalize(dst, n / cfg.elem);
          s.rx->consume(n);
        }
      } else {
        n = s.rx->recv_into(dst, std::min(limit - ro, s.rx->piece_bytes(cfg.piece)));
      }
      if (n == 0) {
        rx_want = s.rx;
        break;
      }
      ro += n;
      progress = true;
      if (ro < s.recv_bytes) break;
    }

    if (progress) {
      idle = false;
      mixed_wait_us = 20;
      continue;
    }
    if (si >= n_steps && ri >= n_steps) break;
    // Stuck on a stream the peer closed (e.g. killed mid-element): waiting cannot help.
    if (rx_want != nullptr && rx_want->peer_gone())
      throw Error(Error::Kind::peer_closed,
                  rx_want->peer_label() + " closed the connection in the middle of a message",
                  rx_want->peer_rank(), rx_want->peer_host());
    const auto now = Clock::now();
    if (!idle) {
      idle = true;
      idle_since = now;
      idle_loops = 0;
    }
    if (now - idle_since < spin) {
      if (++idle_loops > 8) sched_yield();  // share the core with peers on oversubscribed hosts
      continue;
    }
    if (now - idle_since >= cfg.timeout) {
      if (rx_want != nullptr)
        throw Error(Error::Kind::timeout,
                    rx_want->peer_label() + " sent nothing for " + seconds_text(cfg.timeout) +
                        " (stuck or dead? timeout: MLTRAIN_COMM_TIMEOUT)",
                    rx_want->peer_rank(), rx_want->peer_host());
      Link* who = tx_want != nullptr ? tx_want : steps[std::min(si, n_steps - 1)].tx;
      if (who == nullptr) who = steps[std::min(ri, n_steps - 1)].rx;
      throw Error(Error::Kind::timeout,
                  (who ? who->peer_label() : std::string("a peer")) + " took no data for " +
                      seconds_text(cfg.timeout) + " (stuck or dead? timeout: MLTRAIN_COMM_TIMEOUT)",
                  who ? who->peer_rank() : -1, who ? who->peer_host() : std::string());
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        cfg.timeout - (now - idle_since));
    const int cap_ms = static_cast<int>(std::clamp<long long>(left.count() + 1, 1, 200));

    pollfd fds[2];
    int nfds = 0;
    bool any_shm = false;
    for (Link* l : {tx_want, rx_want}) {
      if (l == nullptr) continue;
      if (l->fd() < 0) {
        any_shm = true;
        continue;
      }
      const short ev = l == tx_want ? POLLOUT : POLLIN;
      if (nfds == 1 && fds[0].fd == l->fd()) fds[0].events |= ev;
      else fds[nfds++] = {l->fd(), ev, 0};
    }
    if (tx_want == nullptr && rx_want == nullptr) {
      sched_yield();
    } else if (nfds > 0 && any_shm) {
      const timespec ts{0, mixed_wait_us * 1000};
      ::ppoll(fds, static_cast<nfds_t>(nfds), &ts, nullptr);
      mixed_wait_us = std::min<long>(mixed_wait_us * 2, 1000);
    } else if (nfds > 0) {
      ::poll(fds, static_cast<nfds_t>(nfds), cap_ms);
    } else if (cfg.bell != nullptr) {
      Bell* bell = cfg.bell;
      bell->waiters.fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t seen = bell->seq.load(std::memory_order_seq_cst);
      const bool ready = (tx_want && tx_want->can_send()) || (rx_want && rx_want->can_recv());
      if (!ready) sleep_on_bell(bell, seen, cap_ms);
      bell->waiters.fetch_sub(1, std::memory_order_seq_cst);
    }
    // A peer that exited after sending its last bytes is fine: only blame it when nothing is
    // left to read from it (or no room to write to it).
    if (rx_want != nullptr && !rx_want->can_recv() && !rx_want->peer_alive())
      throw Error(Error::Kind::peer_closed, rx_want->peer_label() + ": its process is gone",
                  rx_want->peer_rank(), rx_want->peer_host());
    for (Link* l : {tx_want})
      if (l != nullptr && !l->can_send() && !l->peer_alive())
        throw Error(Error::Kind::peer_closed, l->peer_label() + ": its process is gone",
                    l->peer_rank(), l->peer_host());
  }
}

}  // namespace mltrain::comm::detail
