#include "algorithms/engine.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "mltrain/comm.hpp"
#include "transport/progress.h"

namespace mltrain::comm::detail {

namespace {

const std::byte kZeros[8] = {};

std::string seconds_text(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

namespace {

// One step list's progress: a send cursor and a receive cursor.
struct Cursor {
  std::vector<Step>* steps;
  std::size_t si = 0, so = 0, spad = 0;
  std::size_t ri = 0, ro = 0, rpad = 0;
  bool send_started = false, recv_started = false;
  bool done() const { return si >= steps->size() && ri >= steps->size(); }
};

// Send side: at most one piece per pass, so receives (and other channels) interleave.
// Returns true on progress; sets *want to the link it waits to write to, if any.
bool pump_send(Cursor& c, const EngineConfig& cfg, Link** want) {
  auto& steps = *c.steps;
  const std::size_t n_steps = steps.size();
  bool progress = false;
  while (c.si < n_steps) {
    Step& s = steps[c.si];
    if (s.tx == nullptr) {
      ++c.si;
      c.send_started = false;
      continue;
    }
    if (!c.send_started) {
      c.spad = s.align ? (8 - s.tx->tx_pos() % 8) % 8 : 0;
      c.so = 0;
      c.send_started = true;
    }
    if (c.spad > 0) {
      const std::size_t k = s.tx->send_some(kZeros, c.spad);
      c.spad -= k;
      progress |= k > 0;
      if (c.spad > 0) {
        *want = s.tx;
        break;
      }
    }
    std::size_t limit = s.send_bytes;
    if (s.send_dep >= 0) {
      const auto dep = static_cast<std::size_t>(s.send_dep);
      if (c.ri < dep)
        limit = 0;
      else if (c.ri == dep) {
        const std::int64_t avail = static_cast<std::int64_t>(c.ro) + s.send_dep_lead;
        limit = std::min<std::size_t>(limit, avail > 0 ? static_cast<std::size_t>(avail) : 0);
      }
    }
    if (c.so == s.send_bytes) {
      ++c.si;
      c.send_started = false;
      continue;
    }
    if (c.so >= limit) break;  // waits on a receive
    const std::size_t k = s.tx->send_some(static_cast<const std::byte*>(s.send) + c.so,
                                          std::min(limit - c.so, s.tx->piece_bytes(cfg.piece)));
    c.so += k;
    progress |= k > 0;
    if (c.so == s.send_bytes) {
      ++c.si;
      c.send_started = false;
      continue;
    }
    if (k == 0) *want = s.tx;
    break;
  }
  return progress;
}

// Receive side: copy or reduce straight out of the link's buffer.
bool pump_recv(Cursor& c, std::size_t channel, const EngineConfig& cfg,
               const std::function<void(std::size_t, std::size_t)>& on_header, Link** want) {
  auto& steps = *c.steps;
  const std::size_t n_steps = steps.size();
  bool progress = false;
  while (c.ri < n_steps) {
    Step& s = steps[c.ri];
    if (s.rx == nullptr) {
      ++c.ri;
      c.recv_started = false;
      continue;
    }
    if (!c.recv_started) {
      c.rpad = s.align ? (8 - s.rx->rx_pos() % 8) % 8 : 0;
      c.ro = 0;
      c.recv_started = true;
    }
    if (c.rpad > 0) {
      const auto view = s.rx->peek();
      const std::size_t k = std::min(view.size(), c.rpad);
      if (k > 0) {
        s.rx->consume(k);
        c.rpad -= k;
        progress = true;
      }
      if (c.rpad > 0) {
        *want = s.rx;
        break;
      }
    }
    if (c.ro == s.recv_bytes) {
      if (s.header && on_header) on_header(channel, c.ri);
      ++c.ri;
      c.recv_started = false;
      continue;
    }
    std::size_t limit = s.recv_bytes;
    if (s.recv_dep >= 0) {  // do not overwrite bytes still to be sent
      const auto dep = static_cast<std::size_t>(s.recv_dep);
      if (c.si < dep)
        limit = 0;
      else if (c.si == dep)
        limit = std::min(limit, c.so);
    }
    if (c.ro >= limit) break;  // waits on a send
    auto* dst = static_cast<std::byte*>(s.recv) + c.ro;
    std::size_t n = 0;
    if (s.reduce) {
      const auto view = s.rx->peek();
      n = std::min({view.size(), limit - c.ro, s.rx->piece_bytes(cfg.piece)});
      n -= n % cfg.elem;
      if (n > 0) {
        cfg.reduce(dst, static_cast<const std::byte*>(s.own) + c.ro, view.data(), n / cfg.elem);
        if (s.finalize) cfg.finalize(dst, n / cfg.elem);
        s.rx->consume(n);
      }
    } else {
      n = s.rx->recv_into(dst, std::min(limit - c.ro, s.rx->piece_bytes(cfg.piece)));
    }
    if (n == 0) {
      *want = s.rx;
      break;
    }
    c.ro += n;
    progress = true;
    if (c.ro < s.recv_bytes) break;
  }
  return progress;
}

// The link a timeout is blamed on when nothing is waited on explicitly.
Link* stalled_link(const Cursor& c) {
  const auto& steps = *c.steps;
  if (steps.empty()) return nullptr;
  Link* who = steps[std::min(c.si, steps.size() - 1)].tx;
  if (who == nullptr) who = steps[std::min(c.ri, steps.size() - 1)].rx;
  return who;
}

// Nothing moved for the whole timeout: blame the first link waited on to read from, else to
// write to, else where a channel stands.
[[noreturn]] void throw_stalled(const std::vector<Cursor>& cursors, const std::vector<Link*>& tx_wants,
                                const std::vector<Link*>& rx_wants, std::chrono::milliseconds timeout) {
  for (Link* l : rx_wants)
    if (l != nullptr)
      throw Error(Error::Kind::timeout,
                  l->peer_label() + " sent nothing for " + seconds_text(timeout) +
                      " (stuck or dead? timeout: MLTRAIN_COMM_TIMEOUT)",
                  l->peer_rank(), l->peer_host());
  Link* who = nullptr;
  for (std::size_t ch = 0; who == nullptr && ch < tx_wants.size(); ++ch) who = tx_wants[ch];
  for (std::size_t ch = 0; who == nullptr && ch < cursors.size(); ++ch)
    if (!cursors[ch].done()) who = stalled_link(cursors[ch]);
  throw Error(Error::Kind::timeout,
              (who ? who->peer_label() : std::string("a peer")) + " took no data for " +
                  seconds_text(timeout) + " (stuck or dead? timeout: MLTRAIN_COMM_TIMEOUT)",
              who ? who->peer_rank() : -1, who ? who->peer_host() : std::string());
}

}  // namespace

void run_channels(std::vector<std::vector<Step>>& channels, const EngineConfig& cfg,
                  const std::function<void(std::size_t, std::size_t)>& on_header) {
  std::vector<Cursor> cursors;
  cursors.reserve(channels.size());
  for (auto& steps : channels) cursors.push_back(Cursor{&steps});
  std::vector<Link*> tx_wants(cursors.size()), rx_wants(cursors.size());
  ProgressWait waiter;
  Clock::time_point idle_since{};
  bool idle = false;
  unsigned idle_loops = 0;
  const auto spin = std::chrono::microseconds(cfg.spin_us);

  while (true) {
    bool progress = false, all_done = true;
    for (std::size_t ch = 0; ch < cursors.size(); ++ch) {
      Cursor& c = cursors[ch];
      tx_wants[ch] = rx_wants[ch] = nullptr;
      if (c.done()) continue;
      progress |= pump_send(c, cfg, &tx_wants[ch]);
      progress |= pump_recv(c, ch, cfg, on_header, &rx_wants[ch]);
      all_done &= c.done();
    }
    if (all_done) break;
    if (progress) {
      idle = false;
      waiter.reset();
      continue;
    }
    // Stuck on a stream the peer closed (e.g. killed mid-element): waiting cannot help.
    for (Link* l : rx_wants)
      if (l != nullptr && l->peer_gone())
        throw Error(Error::Kind::peer_closed,
                    l->peer_label() + " closed the connection in the middle of a message", l->peer_rank(),
                    l->peer_host());
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
    if (now - idle_since >= cfg.timeout) throw_stalled(cursors, tx_wants, rx_wants, cfg.timeout);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(cfg.timeout - (now - idle_since));
    const int cap_ms = static_cast<int>(std::clamp<long long>(left.count() + 1, 1, 200));

    waiter.wait(tx_wants, rx_wants, cfg.bell, cap_ms);
  }
}

}  // namespace mltrain::comm::detail
