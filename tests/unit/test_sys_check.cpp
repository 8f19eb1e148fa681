#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "runner/common/sys_check.h"

using namespace mltrain;

TEST_CASE("sys_check: a failed call names itself, what it worked on and errno") {
  const std::string missing = "/nonexistent-mltrain-dir/sub";
  try {
    check_sys(::mkdir(missing.c_str(), 0755), "mkdir", missing, "set MLTRAIN_HOME to a writable folder");
    FAIL("mkdir in a missing folder succeeded");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "mkdir " + missing + ": No such file or directory");
    CHECK(e.hint() == "set MLTRAIN_HOME to a writable folder");
    CHECK(e.code() == exit_code::internal);
  }
  CHECK_THROWS_WITH_AS(check_sys(::fcntl(-1, F_GETFL), "fcntl(F_GETFL)", "fd -1"),
                       "fcntl(F_GETFL) fd -1: Bad file descriptor", Error);
}

TEST_CASE("sys_check: a call that worked passes its result through") {
  const int fd = check_sys(::open("/dev/null", O_RDONLY | O_CLOEXEC), "open", "/dev/null");
  CHECK(fd >= 0);
  CHECK(check_sys(::close(fd), "close", "/dev/null") == 0);
  CHECK(sys_error_text("write", "/x", ENOSPC) == "write /x: No space left on device");
}
