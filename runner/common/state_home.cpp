#include "runner/common/state_home.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "knobs/knobs.h"
#include "runner/common/error.h"
#include "runner/common/sys_check.h"

namespace mltrain {

std::string state_home() {
  if (knobs::mltrain_home.is_set()) return knobs::mltrain_home.get();
  if (const std::string x = knobs::xdg_state_home.get(); !x.empty()) return x + "/mltrain";
  if (const std::string h = knobs::home.get(); !h.empty()) return h + "/.local/state/mltrain";
  return "/tmp/mltrain-" + std::to_string(::getuid());
}

void make_private_dirs(const std::string& path, bool make_private) {
  std::string cur;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    cur = path.substr(0, slash);
    pos = slash + 1;
    if (cur.empty() || cur.back() == '/') continue;
    if (::mkdir(cur.c_str(), 0700) == 0) {
      ::chmod(cur.c_str(), 0700);  // the umask may have taken the owner's bits
    } else if (errno != EEXIST) {
      throw_sys("mkdir", cur, "set MLTRAIN_HOME to a writable folder", exit_code::state);
    } else if (make_private && slash == path.size()) {
      struct stat st {};
      if (::stat(cur.c_str(), &st) == 0 && (st.st_mode & 077) != 0 && st.st_uid == ::getuid())
        ::chmod(cur.c_str(), 0700);
    }
  }
}

}  // namespace mltrain
