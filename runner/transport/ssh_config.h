// The ssh config as mltrain reads it for the settings it acts on itself (ProxyJump, ConnectTimeout,
// StrictHostKeyChecking); libssh applies the rest when it parses the same file. Pure but for
// reading the file and its Includes; no libssh here.
//
// What it understands, as ssh_config(5) says: `#` comments; keywords in any case; `Key value`,
// `Key=value` and `Key = value`; double-quoted values; Host blocks with `*`/`?` patterns and
// `!` negation (the host is compared without case); `Match all`, `Match host` and
// `Match originalhost` (every other Match criterion makes the block not apply, so mltrain never
// acts on a setting ssh might not use); Include (globs, relative to ~/.ssh, nested up to 16 deep,
// conditional on the block it is in). The first value given for a keyword wins.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mltrain::transport {

class SshConfig {
 public:
  // Reads the config at `path`; a file that does not exist is an empty config. `home` is where
  // `~` and relative Include paths point (~/.ssh).
  static SshConfig load(const std::string& path, const std::string& home);
  // Parses config text. Include paths are resolved against `home` and read from disk.
  static SshConfig parse(std::string_view text, const std::string& home);

  // The first value `keyword` (any case) has for `host`, unquoted, or "" when none applies.
  std::string value(const std::string& host, std::string_view keyword) const;
  // Every value `keyword` has for `host`, in order (IdentityFile, which adds up rather than wins).
  std::vector<std::string> values(const std::string& host, std::string_view keyword) const;

 private:
  struct Line {
    std::string keyword;                      // lower case
    std::vector<std::string> args;            // unquoted words
    std::string value;                        // the value text, unquoted when it is one quoted token
    std::vector<std::vector<Line>> included;  // an Include's files, each its lines
  };
  static std::vector<Line> parse_lines(std::string_view text, const std::string& home, int depth);
  // The first value into `out`; with `all`, every value into it (and false: go on).
  static bool lookup(const std::vector<Line>& lines, const std::string& host, const std::string& keyword,
                     std::string& out, std::vector<std::string>* all = nullptr);
  std::vector<Line> lines_;
};

// True when `host` matches the pattern list (whitespace- or comma-separated, `*`, `?`, `!`): some
// positive pattern matches and no negated one does. Case does not matter.
bool ssh_host_matches(const std::string& host, const std::vector<std::string>& patterns);

// `~` or `~/...` with `home` put in front; any other path as it is.
std::string expand_home(const std::string& path, const std::string& home);

// The ProxyCommand that does what `ProxyJump jump` does while reading `config` (libssh's own
// ProxyJump runs `ssh -W` against ~/.ssh/config, not the file the user named).
std::string proxy_command_for_jump(const std::string& config, const std::string& jump);

}  // namespace mltrain::transport
