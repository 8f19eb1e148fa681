#include "runner/common/regex.h"

#include <re2/re2.h>

namespace mltrain::text {

struct Regex::Impl {
  explicit Impl(std::string_view pattern, const RE2::Options& o) : re(re2::StringPiece(pattern), o) {}
  RE2 re;
};

namespace {

// How deep groups nest, escapes and classes skipped: RE2 parses recursively too.
int depth_of(std::string_view p) {
  int depth = 0, most = 0;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\') {
      ++i;
    } else if (in_class) {
      in_class = p[i] != ']';
    } else if (p[i] == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == ']') ++i;
    } else if (p[i] == '(') {
      most = std::max(most, ++depth);
    } else if (p[i] == ')') {
      --depth;
    }
  }
  return most;
}

}  // namespace

Regex::Regex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Regex::~Regex() = default;

std::unique_ptr<Regex> Regex::compile(std::string_view pattern, std::string& error) {
  if (pattern.size() > kMaxPattern) {
    error = "the pattern is " + std::to_string(pattern.size()) + " characters long; at most " +
            std::to_string(kMaxPattern) + " are taken";
    return nullptr;
  }
  if (depth_of(pattern) > kMaxDepth) {
    error = "the pattern nests groups more than " + std::to_string(kMaxDepth) + " deep";
    return nullptr;
  }
  RE2::Options o;
  o.set_log_errors(false);
  o.set_max_mem(8 << 20);  // the compiled program and its DFA caches, at most
  auto impl = std::make_unique<Impl>(pattern, o);
  if (!impl->re.ok()) {
    error = impl->re.error();
    return nullptr;
  }
  std::unique_ptr<Regex> r(new Regex(std::move(impl)));
  const int n = r->impl_->re.NumberOfCapturingGroups();
  r->names_.assign(size_t(std::max(n, 0)), "");
  for (const auto& [index, name] : r->impl_->re.CapturingGroupNames())
    if (index >= 1 && index <= n) r->names_[size_t(index - 1)] = name;
  return r;
}

bool Regex::search(std::string_view text) const {
  return RE2::PartialMatch(re2::StringPiece(text.data(), text.size()), impl_->re);
}

bool Regex::search(std::string_view text, std::vector<std::string_view>& groups) const {
  const size_t n = names_.size();
  std::vector<re2::StringPiece> found(n + 1);
  if (!impl_->re.Match(re2::StringPiece(text.data(), text.size()), 0, text.size(), RE2::UNANCHORED,
                       found.data(), int(n + 1)))
    return false;
  groups.assign(n, std::string_view());
  for (size_t g = 0; g < n; ++g)
    if (found[g + 1].data()) groups[g] = std::string_view(found[g + 1].data(), found[g + 1].size());
  return true;
}

}  // namespace mltrain::text
