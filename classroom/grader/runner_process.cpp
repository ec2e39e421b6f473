// The checker's process side (runner_process.h): a runner process per case, its limits, and
// the kill and sweep of what it left behind.
#include "runner_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/resource.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace fa::grader {
namespace {

/// Removes `name` in the open folder `dir` and everything under it, at any depth: `rm -rf`
/// run from `dir` (GNU rm walks a tree of any depth without following links, where a recursion
/// here would stop at some depth and leave the rest).
void remove_tree(int dir, const char* name) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (fchdir(dir) != 0) _exit(1);
    execl("/bin/rm", "rm", "-rf", "--one-file-system", "--", name, static_cast<char*>(nullptr));
    _exit(1);
  }
  if (pid > 0) waitpid(pid, nullptr, 0);
}

/// As root, after the runner's user has no process left: what that user made in the shared
/// writable places (empty files, folders, FIFOs, links: RLIMIT_FSIZE 0 stops only data), at any
/// depth, and its System V IPC objects go, so nothing a runner leaves outlives its case. A
/// folder of the user's goes whole (remove_tree); a folder of another's is searched, since the
/// user may have written into it when it is open to others.
void sweep_dir(int dir, uid_t uid, int depth) {
  const int listing = dup(dir);
  DIR* d = listing >= 0 ? fdopendir(listing) : nullptr;
  if (!d) {
    if (listing >= 0) close(listing);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.push_back(e->d_name);
  closedir(d);
  for (const std::string& name : names) {
    struct stat st;
    if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (st.st_uid == uid) {
      if (S_ISDIR(st.st_mode)) remove_tree(dir, name.c_str());
      else unlinkat(dir, name.c_str(), 0);
      continue;
    }
    // Another user's folder: the runner's user can have written in it only where it is open
    // to others (or to the user's group), and only a sandbox user can make such folders deep.
    const bool open_to_user = (st.st_mode & S_IWOTH) || ((st.st_mode & S_IWGRP) && st.st_gid == gid_t(uid));
    if (S_ISDIR(st.st_mode) && open_to_user && depth < 64) {
      const int sub = openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        sweep_dir(sub, uid, depth + 1);
        close(sub);
      }
    }
  }
}

void sweep_user(uid_t uid) {
  for (const char* place : {"/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock"}) {
    const int dir = open(place, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0) continue;
    sweep_dir(dir, uid, 0);
    close(dir);
  }
  // System V shared memory, semaphores and message queues the user made or owns (/proc/sysvipc
  // lists id, uid and cuid; each table's header names its columns).
  for (const char* table : {"shm", "sem", "msg"}) {
    std::FILE* f = std::fopen((std::string("/proc/sysvipc/") + table).c_str(), "r");
    if (!f) continue;
    const std::string kind = table;
    char line[1024];
    int id_col = -1;
    std::vector<int> uid_cols;
    if (std::fgets(line, sizeof line, f)) {
      std::istringstream head(line);
      std::string w;
      for (int i = 0; head >> w; ++i) {
        if (w == (kind == "shm" ? "shmid" : kind == "sem" ? "semid" : "msqid")) id_col = i;
        if (w == "uid" || w == "cuid") uid_cols.push_back(i);
      }
    }
    while (id_col >= 0 && !uid_cols.empty() && std::fgets(line, sizeof line, f)) {
      std::istringstream row(line);
      std::vector<long long> v;
      for (long long x; row >> x;) v.push_back(x);
      bool owned = false;
      for (int c : uid_cols) owned |= c < int(v.size()) && uid_t(v[std::size_t(c)]) == uid;
      if (id_col >= int(v.size()) || !owned) continue;
      const int id = int(v[std::size_t(id_col)]);
      if (kind == "shm") shmctl(id, IPC_RMID, nullptr);
      else if (kind == "sem") semctl(id, 0, IPC_RMID);
      else msgctl(id, IPC_RMID, nullptr);
    }
    std::fclose(f);
  }
}

/// Whether a process of `uid` other than the caller is alive (zombies, which only wait to be
/// reaped, do not count).
bool any_alive(uid_t uid) {
  DIR* proc = opendir("/proc");
  if (!proc) return false;
  bool found = false;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == long(getpid())) continue;
    const std::string path = std::string("/proc/") + e->d_name + "/status";
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;
    char line[256];
    bool zombie = false, mine = false;
    while (std::fgets(line, sizeof line, f)) {
      unsigned long real = 0;
      if (std::strncmp(line, "State:", 6) == 0) zombie = std::strchr(line, 'Z') != nullptr;
      if (std::sscanf(line, "Uid: %lu", &real) == 1) mine = real == uid;
    }
    std::fclose(f);
    if (mine && !zombie) {
      found = true;
      break;
    }
  }
  closedir(proc);
  return found;
}

void kill_leftovers(const RunLimits& limits) {
  if (geteuid() == 0) {
    // Every process of the runner's user: a helper takes that uid and signals them all.
    const pid_t killer = fork();
    if (killer == 0) {
      if (setgroups(0, nullptr) != 0 || setgid(gid_t(limits.uid)) != 0 || setuid(uid_t(limits.uid)) != 0) _exit(1);
      // Until none is left (one that was forking as the first signal went out is caught by the
      // next). kill(-1) itself says nothing: it succeeds while any other process exists.
      for (int round = 0; round < 1000; ++round) {
        kill(-1, SIGKILL);
        if (!any_alive(uid_t(limits.uid))) break;
        usleep(1000);
      }
      _exit(0);
    }
    if (killer > 0) waitpid(killer, nullptr, 0);
    sweep_user(uid_t(limits.uid));
  }
  // Orphans re-parented to this subreaper: signal the children still listed, then reap.
  for (int round = 0; round < 50; ++round) {
    bool any = false;
    if (DIR* tasks = opendir("/proc/self/task")) {
      while (dirent* t = readdir(tasks)) {
        if (t->d_name[0] == '.') continue;
        const std::string path = std::string("/proc/self/task/") + t->d_name + "/children";
        if (std::FILE* f = std::fopen(path.c_str(), "r")) {
          for (long pid; std::fscanf(f, "%ld", &pid) == 1;) {
            kill(pid_t(pid), SIGKILL);
            any = true;
          }
          std::fclose(f);
        }
      }
      closedir(tasks);
    }
    while (waitpid(-1, nullptr, WNOHANG) > 0) any = true;
    if (!any) break;
    usleep(20000);
  }
}

}  // namespace

Reply ask(const RunLimits& limits, const std::string& runner, const Header& header, const std::vector<float>& input,
          std::size_t expect_values) {
  Reply reply;
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe(in_pipe) || pipe(out_pipe) || pipe(err_pipe)) {
    reply.error = "grader: pipe failed";
    return reply;
  }
  char jail[] = "/tmp/fa_runner_XXXXXX";
  if (!mkdtemp(jail)) {
    reply.error = "grader: mkdtemp failed";
    return reply;
  }
  chmod(jail, 0555);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setsid();
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (int fd = 3; fd < 1024; ++fd) close(fd);
    if (chdir(jail) != 0) _exit(126);
    signal(SIGXFSZ, SIG_IGN);  // a write to a file fails (EFBIG) instead of killing the runner
    const rlim_t cpu = rlim_t(limits.timeout_s) + 5;
    const rlimit no_core{0, 0}, no_files{0, 0}, cpu_limit{cpu, cpu};
    setrlimit(RLIMIT_CORE, &no_core);
    setrlimit(RLIMIT_FSIZE, &no_files);
    setrlimit(RLIMIT_CPU, &cpu_limit);
    if (limits.memory_mb > 0) {
      const rlim_t bytes = rlim_t(limits.memory_mb) << 20;
      const rlimit address_space{bytes, bytes};
      if (setrlimit(RLIMIT_AS, &address_space) != 0) _exit(124);
    }
    if (geteuid() == 0) {
      // A CPU runner (the one with an address-space limit) starts no thread: its work stays on
      // one core, beside the GPU gradings a machine may be timing. The CUDA runtime's own threads
      // need a GPU runner's allowance.
      const rlimit procs = limits.memory_mb > 0 ? rlimit{1, 1} : rlimit{256, 256};
      if (setgroups(0, nullptr) != 0 || setgid(gid_t(limits.uid)) != 0 || setuid(uid_t(limits.uid)) != 0) _exit(125);
      setrlimit(RLIMIT_NPROC, &procs);
    }
    std::vector<std::string> env = {"PATH=/usr/bin:/bin", "CUDA_CACHE_DISABLE=1", "HOME=/nonexistent"};
    for (const char* keep : {"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"})
      if (const char* v = getenv(keep)) env.push_back(std::string(keep) + "=" + v);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    char* argv[] = {const_cast<char*>(runner.c_str()), nullptr};
    execve(runner.c_str(), argv, envp.data());
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  Header sized = header;  // the value count goes with the values, so it is never out of step
  sized.args["in"] = std::to_string(input.size());
  std::string request = sized.line();
  request.append(reinterpret_cast<const char*>(input.data()), input.size() * sizeof(float));
  std::string out, err;
  std::size_t written = 0;
  fcntl(in_pipe[1], F_SETFL, O_NONBLOCK);
  bool out_open = true, err_open = true, in_open = true, timed_out = false;
  // An answer is its header line and the values expected; a runner that writes much more is cut off.
  const std::size_t max_out = 4096 + (expect_values ? expect_values * sizeof(float) : std::size_t(1) << 28);
  bool flooded = false;
  while (out_open || err_open) {
    const double left = limits.timeout_s * 1000 -
                        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[3];
    int n = 0;
    if (out_open) fds[n++] = {out_pipe[0], POLLIN, 0};
    if (err_open) fds[n++] = {err_pipe[0], POLLIN, 0};
    if (in_open) fds[n++] = {in_pipe[1], POLLOUT, 0};
    if (poll(fds, nfds_t(n), int(std::min(left, 1000.0))) < 0 && errno != EINTR) break;
    char buf[1 << 16];
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      if (fds[i].fd == in_pipe[1]) {
        const ssize_t w = write(in_pipe[1], request.data() + written, request.size() - written);
        if (w > 0) written += std::size_t(w);
        if (w < 0 && errno != EAGAIN) written = request.size();
        if (written == request.size()) {
          close(in_pipe[1]);
          in_open = false;
        }
        continue;
      }
      const ssize_t r = read(fds[i].fd, buf, sizeof buf);
      if (r <= 0) {
        (fds[i].fd == out_pipe[0] ? out_open : err_open) = false;
        continue;
      }
      if (fds[i].fd == out_pipe[0]) {
        out.append(buf, std::size_t(r));
        if (out.size() > max_out) {
          flooded = true;
          out_open = err_open = false;
        }
      } else if (err.size() < 2000) {
        err.append(buf, std::size_t(r));
      }
    }
  }
  if (in_open) close(in_pipe[1]);
  close(out_pipe[0]);
  close(err_pipe[0]);
  kill(-pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  kill_leftovers(limits);
  rmdir(jail);
  reply.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (flooded) {
    reply.error = "the runner wrote more than an answer holds (" + std::to_string(max_out) + " bytes) and was stopped";
    return reply;
  }
  if (timed_out) {
    reply.timed_out = true;
    reply.error = "the runner ran past the time limit (" + std::to_string(int(limits.timeout_s)) + " s)";
    return reply;
  }
  const std::size_t nl = out.find('\n');
  const std::string line = nl == std::string::npos ? out.substr(0, 200) : out.substr(0, nl);
  auto tail = [&] {
    std::string e = err.substr(0, 600);
    std::replace(e.begin(), e.end(), '\n', ' ');
    return e.empty() ? std::string() : " (its stderr: " + e + ")";
  };
  if (line.rfind("error ", 0) == 0) {
    // A failure always carries a reason: an empty one (a student's exception with no message)
    // would read as "passed" to whoever takes an empty reason for success.
    reply.error = line.substr(6, 500);
    if (reply.error.find_first_not_of(" \t\r") == std::string::npos)
      reply.error = "the runner failed without a message";
    return reply;
  }
  if (nl == std::string::npos || line.rfind("ok ", 0) != 0) {
    std::string how = WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                          : "exited with status " + std::to_string(WEXITSTATUS(status));
    reply.error = "the runner " + how + " without an answer" + tail();
    if (limits.memory_mb > 0)
      reply.error += " (a runner may use " + std::to_string(limits.memory_mb) + " MiB of address space)";
    return reply;
  }
  try {
    const Header h = parse_header(line);
    const std::size_t n = std::size_t(h.num("out"));
    if (out.size() - nl - 1 != n * sizeof(float)) {
      reply.error = "the runner's answer holds " + std::to_string((out.size() - nl - 1) / sizeof(float)) +
                    " values, not the " + std::to_string(n) + " its header says";
      return reply;
    }
    reply.out.resize(n);
    std::memcpy(reply.out.data(), out.data() + nl + 1, n * sizeof(float));
    if (h.args.count("ms")) {
      reply.ms = std::atof(h.str("ms").c_str());
      reply.iters = int(h.num("iters"));
      const std::string scale = h.str("qscale");
      char* end = nullptr;
      reply.q_scale = std::strtod(scale.c_str(), &end);
      if (end == scale.c_str() || *end != '\0' || !(reply.q_scale > 0))
        throw std::runtime_error("'qscale' is not a positive number");
    }
  } catch (const std::exception& e) {
    reply.error = std::string("malformed answer: ") + e.what();
    return reply;
  }
  reply.ok = true;
  return reply;
}

}  // namespace fa::grader
