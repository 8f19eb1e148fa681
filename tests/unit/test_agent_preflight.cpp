#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "runner/agent/gpu_inventory.h"
#include "runner/agent/oom.h"
#include "runner/agent/preflight.h"
#include "temp_dir.h"

using namespace mltrain::agent;

namespace {

// A file system holding exactly the given folders and executable files.
FileSystemView fake_fs(std::set<std::string> dirs, std::set<std::string> executables) {
  FileSystemView fs;
  fs.is_directory = [dirs](const std::string& p) { return dirs.count(p) > 0; };
  fs.is_executable_file = [executables](const std::string& p) { return executables.count(p) > 0; };
  return fs;
}

}  // namespace

TEST_CASE("agent preflight: the interface carrying the local address") {
  std::vector<InterfaceAddress> ifs = {{"lo", AF_INET, "127.0.0.1"},
                                       {"eth0", AF_INET6, "fe80::1"},
                                       {"eth0", AF_INET, "10.0.0.2"},
                                       {"eth1", AF_INET, "10.0.0.2"},
                                       {"ib0", AF_INET, "192.168.7.3"}};
  CHECK(interface_with_address(ifs, AF_INET, "10.0.0.2") == "eth0");  // the first listed wins
  CHECK(interface_with_address(ifs, AF_INET, "192.168.7.3") == "ib0");
  CHECK(interface_with_address(ifs, AF_INET6, "fe80::1") == "eth0");
  CHECK(interface_with_address(ifs, AF_INET6, "10.0.0.2") == "");  // wrong family
  CHECK(interface_with_address(ifs, AF_INET, "10.9.9.9") == "");
  CHECK(interface_with_address({}, AF_INET, "10.0.0.2") == "");
}

TEST_CASE("agent preflight: route to a loopback master goes over lo") {
  Route r = route_to("127.0.0.1");
  CHECK(r.local_ip == "127.0.0.1");
  CHECK(r.ifname == "lo");
  Route none = route_to("no-such-host.invalid");
  CHECK(none.ifname.empty());
  CHECK(none.local_ip.empty());
}

TEST_CASE("agent preflight: free ports are distinct and capped") {
  std::vector<std::string> problems;
  auto ports = reserve_free_ports(4, problems);
  CHECK(problems.empty());
  REQUIRE(ports.size() == 4);
  CHECK(std::set<std::string>(ports.begin(), ports.end()).size() == 4);
  for (const auto& p : ports) {
    CAPTURE(p);
    CHECK(std::stoi(p) > 0);
    CHECK(std::stoi(p) < 65536);
  }
  CHECK(reserve_free_ports(100, problems).size() == kMaxPreflightPorts);
  CHECK(reserve_free_ports(0, problems).empty());
  CHECK(problems.empty());
}

TEST_CASE("agent preflight: the PATH programs are looked up in") {
  CHECK(effective_path("/opt/bin", "/usr/bin") == "/opt/bin");
  CHECK(effective_path("", "/usr/local/bin:/usr/bin") == "/usr/local/bin:/usr/bin");
  CHECK(effective_path("", nullptr) == "/usr/bin:/bin");
}

TEST_CASE("agent preflight: program candidates follow execvp's lookup") {
  using V = std::vector<std::string>;
  CHECK(program_candidates("python3", "", "/usr/local/bin:/usr/bin") ==
        V{"/usr/local/bin/python3", "/usr/bin/python3"});
  // Empty entries mean the current folder, relative ones are taken from the workdir.
  CHECK(program_candidates("train", "/w", "/usr/bin::bin:") ==
        V{"/usr/bin/train", "/w/./train", "/w/bin/train", "/w/./train"});
  CHECK(program_candidates("train", "", ":bin") == V{"./train", "bin/train"});
  // With a slash: the file itself, from the workdir unless absolute; PATH plays no part.
  CHECK(program_candidates("./train.sh", "/w", "/usr/bin") == V{"/w/./train.sh"});
  CHECK(program_candidates("sub/train.sh", "", "/usr/bin") == V{"sub/train.sh"});
  CHECK(program_candidates("/opt/x/train", "/w", "/usr/bin") == V{"/opt/x/train"});
  CHECK(program_candidates("", "/w", "/usr/bin").empty());
}

TEST_CASE("agent preflight: workdir and program problems") {
  auto fs = fake_fs({"/w"}, {"/usr/bin/python3", "/w/sub/train.sh", "/w/bin/tool"});
  using V = std::vector<std::string>;
  CHECK(check_workdir_and_program("/w", "python3", "/usr/local/bin:/usr/bin", fs).empty());
  CHECK(check_workdir_and_program("/w", "sub/train.sh", "/usr/bin", fs).empty());
  CHECK(check_workdir_and_program("/w", "tool", "/usr/bin:bin", fs).empty());
  CHECK(check_workdir_and_program("", "", "", fs).empty());
  CHECK(check_workdir_and_program("/nope", "python3", "/usr/bin", fs) ==
        V{"workdir /nope does not exist here"});
  CHECK(check_workdir_and_program("/w", "train", "/usr/bin:/bin", fs) ==
        V{"program train not found in PATH (/usr/bin:/bin)"});
  CHECK(check_workdir_and_program("/w", "/opt/train", "/usr/bin", fs) ==
        V{"program /opt/train is not an executable file here"});
  // No workdir: a relative program with a slash is looked up as it is.
  CHECK(check_workdir_and_program("", "/w/sub/train.sh", "/usr/bin", fs).empty());
  CHECK(check_workdir_and_program("", "sub/train.sh", "/usr/bin", fs) ==
        V{"program sub/train.sh is not an executable file here"});
}

TEST_CASE("agent preflight: the real file system") {
  char tmpl[] = "/tmp/mltrain-preflight-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  std::string script = dir + "/run.sh", data = dir + "/data.txt";
  std::ofstream(script) << "#!/bin/sh\n";
  std::ofstream(data) << "x\n";
  REQUIRE(::chmod(script.c_str(), 0755) == 0);
  auto fs = real_file_system();
  CHECK(fs.is_directory(dir));
  CHECK_FALSE(fs.is_directory(script));
  CHECK(fs.is_executable_file(script));
  CHECK_FALSE(fs.is_executable_file(data));
  CHECK_FALSE(fs.is_executable_file(dir));  // a folder is not a program
  CHECK(check_workdir_and_program(dir, "./run.sh", "", fs).empty());
  CHECK(check_workdir_and_program(dir, "run.sh", ".", fs).empty());
  CHECK(check_workdir_and_program(dir, "./data.txt", "", fs) ==
        std::vector<std::string>{"program ./data.txt is not an executable file here"});
  ::unlink(script.c_str());
  ::unlink(data.c_str());
  ::rmdir(dir.c_str());
}

// --- the GPU inventory (gpu_inventory.h) ---------------------------------------------------------

namespace {

std::vector<int> indices(const std::vector<Gpu>& gpus) {
  std::vector<int> v;
  for (const auto& g : gpus) v.push_back(g.index);
  return v;
}

GpuInventory four_gpus() {
  GpuInventory inv;
  for (int i = 0; i < 4; ++i)
    inv.gpus.push_back({i, "GPU-4049c22c-0000-4000-8000-00000000000" + std::to_string(i),
                        "NVIDIA H100 80GB HBM3", 81559, 0});
  inv.gpus[2].uuid = "GPU-8f3c1e2a-0000-4000-8000-000000000002";
  inv.source = "nvml";
  return inv;
}

}  // namespace

TEST_CASE("gpu inventory: nvidia-smi -L as drivers print it") {
  // Plain GPUs (a 2023 driver).
  auto gpus = parse_nvidia_smi_list(
      "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-950792bf-a01c-3f1a-e122-3473e67f54b2)\n"
      "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-c92e2d5d-4a69-f1cd-4df0-305f8606705a)\n");
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].index == 0);
  CHECK(gpus[0].name == "NVIDIA H100 80GB HBM3");
  CHECK(gpus[0].uuid == "GPU-950792bf-a01c-3f1a-e122-3473e67f54b2");
  CHECK(gpus[0].memory_mib == 0);  // -L does not say
  CHECK(gpus[0].mig == -1);        // nor whether MIG is on when no instance is listed
  CHECK(gpus[1].uuid == "GPU-c92e2d5d-4a69-f1cd-4df0-305f8606705a");

  // MIG instances under a GPU (R470+ format), then a GPU without any.
  gpus = parse_nvidia_smi_list(
      "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-2927d07e-3fe9-7904-9e08-b08b82d9a37d)\n"
      "  MIG 1g.10gb     Device  0: (UUID: MIG-6e95ef19-5145-571b-b040-7e731f1c1af3)\n"
      "  MIG 1g.10gb     Device  1: (UUID: MIG-b4bcd4f3-6f69-516d-9404-b5ada80d760b)\n"
      "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-e109d8d9-923e-7235-0429-96b7fdbcbd30)\n");
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].mig == 1);
  CHECK(gpus[0].name == "NVIDIA A100-SXM4-40GB");
  CHECK(gpus[1].mig == -1);

  // The R450 format: one space, MIG UUIDs naming their GPU; no "NVIDIA" in the name.
  gpus = parse_nvidia_smi_list(
      "GPU 0: A100-PCIE-40GB (UUID: GPU-63feeb45-94c6-b9cb-78ea-98e9b7a5be6b)\n"
      "GPU 4: A100-PCIE-40GB (UUID: GPU-fb8bbc70-d551-45f9-43d4-9734f9cddb2c)\n"
      "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-fb8bbc70-d551-45f9-43d4-9734f9cddb2c/1/0)\n"
      "  MIG 3g.20gb Device 1: (UUID: MIG-GPU-fb8bbc70-d551-45f9-43d4-9734f9cddb2c/2/0)\n");
  REQUIRE(gpus.size() == 2);
  CHECK(indices(gpus) == std::vector<int>{0, 4});
  CHECK(gpus[0].mig == -1);
  CHECK(gpus[1].mig == 1);
  CHECK(gpus[1].name == "A100-PCIE-40GB");

  // Odd spacing, tabs, CRLF, parentheses in a name, no UUID, and lines that are not GPUs.
  gpus = parse_nvidia_smi_list(
      "\r\n  GPU  7 :  Tesla K80 (rev 2)   ( UUID :  GPU-abc )\r\n"
      "GPU\t8:\tQuadro RTX 8000\r\n"
      "No devices were found\n"
      "GPU-9: not a GPU line\n"
      "GPU x: not one either\n"
      "\tMIG 2g.20gb Device 0: (UUID: MIG-1)\n");  // after a non-GPU line: belongs to none
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].index == 7);
  CHECK(gpus[0].name == "Tesla K80 (rev 2)");
  CHECK(gpus[0].uuid == "GPU-abc");
  CHECK(gpus[1].index == 8);
  CHECK(gpus[1].name == "Quadro RTX 8000");
  CHECK(gpus[1].uuid.empty());
  CHECK(gpus[1].mig == -1);

  CHECK(parse_nvidia_smi_list("").empty());
  CHECK(parse_nvidia_smi_list("No devices were found\n").empty());
}

TEST_CASE("gpu inventory: CUDA_VISIBLE_DEVICES as CUDA reads it") {
  auto inv = four_gpus();
  using V = std::vector<int>;
  CHECK(visible_gpus(inv, std::nullopt) == V{0, 1, 2, 3});  // unset: every GPU
  CHECK(visible_gpus(inv, std::string()).empty());          // set and empty: none
  CHECK(visible_gpus(inv, std::string("1,3")) == V{1, 3});
  CHECK(visible_gpus(inv, std::string("3,1")) == V{3, 1});  // CUDA's order is the list's
  CHECK(visible_gpus(inv, std::string(" 2 , 0 ")) == V{2, 0});
  // The list ends at the first entry that names no GPU.
  CHECK(visible_gpus(inv, std::string("1,7,2")) == V{1});
  CHECK(visible_gpus(inv, std::string("-1")).empty());
  CHECK(visible_gpus(inv, std::string("0,-1,1")) == V{0});
  CHECK(visible_gpus(inv, std::string("0,,1")) == V{0});
  CHECK(visible_gpus(inv, std::string("0,x")) == V{0});
  CHECK(visible_gpus(inv, std::string("1,1,2")) == V{1});
  // UUIDs and unique UUID prefixes; an ambiguous prefix or a MIG instance ends the list.
  CHECK(visible_gpus(inv, std::string("GPU-8f3c1e2a-0000-4000-8000-000000000002,0")) == V{2, 0});
  CHECK(visible_gpus(inv, std::string("GPU-8f3c,gpu-4049c22c-0000-4000-8000-000000000003")) == V{2, 3});
  CHECK(visible_gpus(inv, std::string("1,GPU-4049")) == V{1});
  CHECK(visible_gpus(inv, std::string("MIG-6e95ef19-5145-571b-b040-7e731f1c1af3")).empty());
  // Indices are the inventory's, which need not start at 0 or be dense (nvidia-smi lists).
  GpuInventory sparse;
  sparse.gpus = {{0, "", "A", 0, -1}, {4, "", "A", 0, -1}};
  CHECK(visible_gpus(sparse, std::string("4,1,0")) == V{4});
  CHECK(visible_gpus(GpuInventory{}, std::string("0")).empty());
}

TEST_CASE("gpu inventory: a host without NVIDIA software has no GPU, and says why") {
  mltrain::testing::TempDir d("gpus");
  auto inv = probe_gpus("", d.str());  // nothing in this PATH; no NVML on the test machine
  if (inv.source == "nvml") return;    // a machine with a real driver: nothing to check here
  CHECK(inv.gpus.empty());
  CHECK(inv.source.empty());
  CHECK(inv.note == "no NVIDIA driver: libnvidia-ml.so.1 not found, nvidia-smi not in PATH");

  auto named = probe_gpus(d.str() + "/libnvidia-ml.so.1", d.str());
  CHECK(named.note == "no GPU found: MLTRAIN_NVML_LIBRARY=" + d.str() +
                          "/libnvidia-ml.so.1: cannot open shared object file: No such file or directory, "
                          "nvidia-smi not in PATH");
}

TEST_CASE("gpu inventory: nvidia-smi -L is the fallback; its failures are quoted") {
  mltrain::testing::TempDir d("gpus");
  const std::string missing_nvml = d.str() + "/none/libnvidia-ml.so.1";
  std::string smi = d.write("bin/nvidia-smi",
                            "#!/bin/sh\n[ \"$1\" = -L ] || exit 2\n"
                            "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)'\n"
                            "echo '  MIG 3g.40gb     Device  0: (UUID: MIG-bbbb)'\n"
                            "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc)'\n");
  REQUIRE(::chmod(smi.c_str(), 0755) == 0);
  auto inv = probe_gpus(missing_nvml, "/nonexistent:" + d.str() + "/bin");
  CHECK(inv.source == "nvidia-smi");
  REQUIRE(inv.gpus.size() == 2);
  CHECK(inv.gpus[0].mig == 1);
  CHECK(inv.gpus[1].uuid == "GPU-cccc");
  CHECK(inv.note.find("MLTRAIN_NVML_LIBRARY=" + missing_nvml) == 0);  // why NVML was not used

  // No driver: nvidia-smi's own exit 9 and message.
  d.write("bin/nvidia-smi",
          "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.\"\nexit 9\n");
  inv = probe_gpus("", d.str() + "/bin");
  if (inv.source == "nvml") return;  // a machine with a real driver
  CHECK(inv.gpus.empty());
  CHECK(
      inv.note ==
      "no NVIDIA driver: libnvidia-ml.so.1 not found, nvidia-smi -L exit 9 (NVIDIA-SMI has failed because it "
      "couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and "
      "running.)");

  d.write("bin/nvidia-smi", "#!/bin/sh\necho 'No devices were found'\nexit 6\n");
  inv = probe_gpus("", d.str() + "/bin");
  CHECK(inv.note ==
        "no GPU found: libnvidia-ml.so.1 not found, nvidia-smi -L exit 6 (No devices were found)");
}

// Issue 31, item 15: "out of memory" only on the kernel's word.
TEST_CASE("oom: the kernel's records of an OOM kill, and nothing else, count") {
  using namespace mltrain::agent::detail;
  CHECK(kmsg_record_kills("3,812,5000000,-;Out of memory: Killed process 4242 (python3) total-vm:1kB", 4242));
  CHECK(
      kmsg_record_kills("3,813,5000000,-;Memory cgroup out of memory: Killed process 4242 (python3)", 4242));
  CHECK(kmsg_record_kills(
      "6,814,5000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid=4242,uid=1000", 4242));
  CHECK_FALSE(kmsg_record_kills("3,815,5000000,-;Out of memory: Killed process 42421 (python3)", 4242));
  CHECK_FALSE(kmsg_record_kills("3,816,5000000,-;Out of memory: Killed process 424 (python3)", 4242));
  CHECK_FALSE(kmsg_record_kills("6,817,5000000,-;python3[4242]: segfault at 0", 4242));
  // A record from before the rank began is of another process that had its pid.
  CHECK_FALSE(
      kmsg_record_kills("3,818,5000000,-;Out of memory: Killed process 4242 (python3)", 4242, 6000000));
  CHECK(parse_oom_kill_count("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n") == 2u);
  CHECK_FALSE(parse_oom_kill_count("low 0\nhigh 0\n").has_value());
  CHECK(cgroup_v2_path("0::/user.slice/user-1000.slice\n") == "/user.slice/user-1000.slice");
  CHECK(cgroup_v2_path("12:memory:/x\n0::/\n") == "/");
  CHECK(cgroup_v2_path("12:memory:/x\n").empty());
}
