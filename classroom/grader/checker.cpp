// The grader's checker: built from the instructor's tree (never from a student's), linked with
// the fp64 oracle and with no student code. For one exercise it draws the inputs at grading time
// (a fresh seed, shapes drawn at random beyond the visible tests'), runs the student's runner
// once per case in a process of its own (protocol.h), and compares what comes back with the
// oracle. It trusts nothing the runner says but its output values: not its exit code, not its
// words, not its files. Its verdict (JSON on stdout) is what tools/grade.py scores.
//
//   fa_check --exercise ID --runner PATH [--reference-runner PATH] [--seed N] [--timeout S]
//            [--uid U] [--student-copy]
//
// The runner runs in a process group of its own, in an empty folder, with a cleared environment, no core
// files, no file writes (RLIMIT_FSIZE 0) and a CPU-time limit; as root the checker first drops
// it to user U (default 65534, "nobody") and, when it is done, kills every process of that user
// that is left; otherwise it kills the orphans it adopts as a subreaper. The checker itself is
// not dumpable, so a runner of the same user cannot read its memory.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../chapters/06_flash_attention_v3/algorithm.h"
#include "../../chapters/08_paged_attention/block_manager.h"
#include "compare.h"
#include "dtype.h"
#include "problem.h"
#include "protocol.h"
#include "reference.h"

namespace fa::grader {
namespace {

// ---- running a runner ----------------------------------------------------------------------

struct Options {
  std::string exercise, runner, reference_runner;
  uint64_t seed = 0;
  double timeout_s = 60;
  int uid = 65534;
  bool student_copy = false;  // built from a handout: no reference solution in it
};

struct Reply {
  bool ok = false;
  std::string error;  // why there are no values: the runner's own "error ..." line, a crash, a timeout
  std::vector<float> out;
  double ms = -1, wall_ms = 0;
  int iters = 0;
  bool timed_out = false;
};

/// As root, after the runner's user has no process left: what that user made in the shared
/// writable places (empty files, folders, FIFOs, links: RLIMIT_FSIZE 0 stops only data), at any
/// depth, and its System V IPC objects go, so nothing a runner leaves outlives its case.
/// `dir` is an open folder; with `all`, everything in it goes (it is the user's own folder).
void sweep_dir(int dir, uid_t uid, bool all, int depth) {
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
    const bool mine = all || st.st_uid == uid;
    if (S_ISDIR(st.st_mode) && depth < 800) {  // one open folder per level
      const int sub = openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        sweep_dir(sub, uid, mine, depth + 1);
        close(sub);
      }
    }
    if (mine) unlinkat(dir, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0);
  }
}

void sweep_user(uid_t uid) {
  for (const char* place : {"/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock"}) {
    const int dir = open(place, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0) continue;
    sweep_dir(dir, uid, false, 0);
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

void kill_leftovers(const Options& opt) {
  if (geteuid() == 0) {
    // Every process of the runner's user: a helper takes that uid and signals them all.
    const pid_t killer = fork();
    if (killer == 0) {
      if (setgroups(0, nullptr) != 0 || setgid(gid_t(opt.uid)) != 0 || setuid(uid_t(opt.uid)) != 0) _exit(1);
      // Until none is left (one that was forking as the first signal went out is caught by the
      // next). kill(-1) itself says nothing: it succeeds while any other process exists.
      for (int round = 0; round < 1000; ++round) {
        kill(-1, SIGKILL);
        if (!any_alive(uid_t(opt.uid))) break;
        usleep(1000);
      }
      _exit(0);
    }
    if (killer > 0) waitpid(killer, nullptr, 0);
    sweep_user(uid_t(opt.uid));
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

/// Runs `runner` with `request` on its stdin; returns what it answered.
Reply ask(const Options& opt, const std::string& runner, const Header& header, const std::vector<float>& input,
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
    const rlim_t cpu = rlim_t(opt.timeout_s) + 5;
    const rlimit no_core{0, 0}, no_files{0, 0}, cpu_limit{cpu, cpu};
    setrlimit(RLIMIT_CORE, &no_core);
    setrlimit(RLIMIT_FSIZE, &no_files);
    setrlimit(RLIMIT_CPU, &cpu_limit);
    if (geteuid() == 0) {
      const rlimit procs{256, 256};
      if (setgroups(0, nullptr) != 0 || setgid(gid_t(opt.uid)) != 0 || setuid(uid_t(opt.uid)) != 0) _exit(125);
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
    const double left = opt.timeout_s * 1000 -
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
  kill_leftovers(opt);
  rmdir(jail);
  reply.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (flooded) {
    reply.error = "the runner wrote more than an answer holds (" + std::to_string(max_out) + " bytes) and was stopped";
    return reply;
  }
  if (timed_out) {
    reply.timed_out = true;
    reply.error = "the runner ran past the time limit (" + std::to_string(int(opt.timeout_s)) + " s)";
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
    reply.error = line.substr(6, 500);
    return reply;
  }
  if (nl == std::string::npos || line.rfind("ok ", 0) != 0) {
    std::string how = WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                          : "exited with status " + std::to_string(WEXITSTATUS(status));
    reply.error = "the runner " + how + " without an answer" + tail();
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
    }
  } catch (const std::exception& e) {
    reply.error = std::string("malformed answer: ") + e.what();
    return reply;
  }
  reply.ok = true;
  return reply;
}

// ---- drawing inputs ------------------------------------------------------------------------

using Rng = std::mt19937_64;

int uniform(Rng& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

std::vector<float> normal(Rng& rng, std::size_t n, float sigma = 1.0f) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> rounded(std::vector<float> v, DType dtype) {
  for (auto& x : v) x = round_to_dtype(x, dtype);
  return v;
}

/// A shape with seq lengths in [lo, hi], head_dim from `dims`, GQA/MQA or not, causal or not.
AttentionShape draw_shape(Rng& rng, int lo, int hi, const std::vector<int>& dims, int max_batch = 2) {
  AttentionShape s;
  s.batch = uniform(rng, 1, max_batch);
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * uniform(rng, 1, 3);
  s.seq_q = uniform(rng, lo, hi);
  s.seq_kv = uniform(rng, 0, 3) == 0 ? s.seq_q : uniform(rng, lo, hi);
  s.head_dim = dims[std::size_t(uniform(rng, 0, int(dims.size()) - 1))];
  s.causal = uniform(rng, 0, 1) == 1;
  return s;
}

// ---- one case: a request and how to judge the answer ----------------------------------------

struct Case {
  std::string name;
  double weight = 1;  // 0: a trivial shape, run and reported but worth nothing alone
  Header header;
  std::vector<float> input;
  std::size_t expect_values = 0;
  std::function<std::string(const std::vector<float>&)> judge;  // "" when right, else why not
  double min_speed = 0;                                         // > 0: a speed case, run by both runners (check_speed)
  bool needs_steps = false;  // counts only when every row-step case of the exercise passed
  bool is_step = false;      // a row-step case (row_step_cases)
};

std::string fmt(double x) {
  std::ostringstream os;
  os.precision(4);
  os << x;
  return os.str();
}

/// O and LSE against the oracle, with the tolerance of `dtype`.
std::function<std::string(const std::vector<float>&)> judge_forward(const AttentionShape& s, std::vector<float> q,
                                                                    std::vector<float> k, std::vector<float> v,
                                                                    DType dtype, uint64_t sample_seed = 0) {
  return [=](const std::vector<float>& out) -> std::string {
    // Every row, or (for a speed case's large shape) rows drawn from sample_seed.
    const CheckPlan plan = sample_seed ? sampled_check_plan(s, sample_seed) : full_check_plan(s);
    const ForwardReference ref = reference_forward(s, q.data(), k.data(), v.data(), plan);
    std::vector<unsigned char> o_raw(std::size_t(s.q_elems()) * sizeof(float));
    std::memcpy(o_raw.data(), out.data(), o_raw.size());
    const std::vector<float> lse(out.begin() + s.q_elems(), out.end());
    const Tolerance tol = tolerance_for(dtype);
    const CompareReport rep = compare_forward(s, DType::F32, o_raw, lse, plan, ref, &tol);
    return rep.passed() ? "" : rep.summary();
  };
}

/// Relative Frobenius error of `got` against `want` (and non-finite values) within `tol`.
std::string close_enough(const char* what, const float* got, const double* want, std::size_t n, double tol) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::string(what) + "[" + std::to_string(i) + "] is not finite";
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  const double rel = std::sqrt(err / std::max(norm, 1e-30));
  return rel <= tol ? "" : std::string(what) + ": relative error " + fmt(rel) + " > " + fmt(tol);
}

/// Rows of scores for the softmax exercises: plain, shifted by up to +-1e4 (exp overflows without
/// the max), with masked (-inf) entries, and now and then a row with no visible entry at all.
std::vector<float> softmax_rows(Rng& rng, int rows, int n) {
  std::vector<float> x = normal(rng, std::size_t(rows) * n, 3.0f);
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + std::size_t(r) * n;
    const int kind = r % 4;
    if (kind == 1) {
      const float shift = float(uniform(rng, -10000, 10000));
      for (int j = 0; j < n; ++j) row[j] += shift;
    } else if (kind == 2) {
      for (int j = 0; j < n; ++j)
        if (uniform(rng, 0, 2) == 0) row[j] = -INFINITY;
    } else if (kind == 3 && r % 8 == 3) {
      for (int j = 0; j < n; ++j) row[j] = -INFINITY;
    }
    if (kind == 0 && n > 8) {  // the max arrives late: every earlier term must be rescaled
      for (int j = 0; j < n; ++j) row[j] = float(j) * 0.05f + row[j] * 0.1f;
    }
  }
  return x;
}

/// m and l of each row in double: (max, sum exp(s - max)).
void exact_state(const float* row, int n, double& m, double& l) {
  m = -INFINITY;
  for (int j = 0; j < n; ++j) m = std::max(m, double(row[j]));
  l = 0;
  if (m == -INFINITY) return;
  for (int j = 0; j < n; ++j) l += std::exp(double(row[j]) - m);
}

std::string judge_state(float m, float l, double m_ref, double l_ref, const std::string& where) {
  if (m_ref == -INFINITY) {
    if (!(m == -INFINITY && l == 0.0f))
      return where + ": a row with no visible score must stay (m, l) = (-inf, 0), got (" + fmt(m) + ", " + fmt(l) + ")";
    return "";
  }
  if (double(m) != m_ref) return where + ": m = " + fmt(m) + ", the row's max is " + fmt(m_ref);
  if (!std::isfinite(l) || std::fabs(l - l_ref) > 2e-5 * l_ref)
    return where + ": l = " + fmt(l) + ", expected " + fmt(l_ref);
  return "";
}

// ---- the exercises -------------------------------------------------------------------------

std::vector<Case> softmax_row_cases(Rng& rng, const std::string& task) {
  std::vector<Case> cases;
  const int lengths[] = {1, uniform(rng, 100, 400), uniform(rng, 900, 2100), uniform(rng, 3000, 5000)};
  for (int n : lengths) {
    Case c;
    const int rows = n == 1 ? 4 : 16;
    c.name = task + " rows=" + std::to_string(rows) + " n=" + std::to_string(n);
    c.weight = n == 1 ? 0 : 1;
    c.header.task = task;
    c.header.args = {{"rows", std::to_string(rows)}, {"n", std::to_string(n)}};
    c.input = softmax_rows(rng, rows, n);
    const std::vector<float> x = c.input;
    if (task == "safe_row") {
      c.expect_values = std::size_t(rows) * n + rows;
      c.judge = [=](const std::vector<float>& out) -> std::string {
        for (int r = 0; r < rows; ++r) {
          double m, l;
          exact_state(x.data() + std::size_t(r) * n, n, m, l);
          const float lse = out[std::size_t(rows) * n + r];
          const std::string where = "row " + std::to_string(r);
          if (m == -INFINITY) {
            if (lse != -INFINITY) return where + " (no visible score): LSE must be -inf, got " + fmt(lse);
            for (int j = 0; j < n; ++j)
              if (out[std::size_t(r) * n + j] != 0.0f) return where + " (no visible score): P must be 0";
            continue;
          }
          const double lse_ref = m + std::log(l);
          if (!(std::fabs(lse - lse_ref) <= 1e-4 * std::max(1.0, std::fabs(lse_ref))))
            return where + ": LSE = " + fmt(lse) + ", expected " + fmt(lse_ref);
          for (int j = 0; j < n; ++j) {
            const double p = std::exp(double(x[std::size_t(r) * n + j]) - lse_ref);
            const float got = out[std::size_t(r) * n + j];
            if (!(std::fabs(got - p) <= 1e-6 + 1e-4 * p))
              return where + ", entry " + std::to_string(j) + ": P = " + fmt(got) + ", expected " + fmt(p);
          }
        }
        return "";
      };
    } else {  // online_update: (m, l) per row
      c.expect_values = std::size_t(rows) * 2;
      c.judge = [=](const std::vector<float>& out) -> std::string {
        for (int r = 0; r < rows; ++r) {
          double m, l;
          exact_state(x.data() + std::size_t(r) * n, n, m, l);
          const std::string why = judge_state(out[2 * r], out[2 * r + 1], m, l, "row " + std::to_string(r));
          if (!why.empty()) return why;
        }
        return "";
      };
    }
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> merge_cases(Rng& rng) {
  std::vector<Case> cases;
  for (int round = 0; round < 4; ++round) {
    Case c;
    const int pairs = round == 0 ? 1 : 64;
    c.name = "online_merge pairs=" + std::to_string(pairs);
    c.weight = round == 0 ? 0 : 1;
    c.header.task = "online_merge";
    c.header.args = {{"pairs", std::to_string(pairs)}};
    std::vector<double> want;
    for (int i = 0; i < pairs; ++i) {
      const int n = uniform(rng, 2, 300), split = uniform(rng, 0, n);
      std::vector<float> row = softmax_rows(rng, 4, n);
      const float* x = row.data() + std::size_t(n) * (round == 0 ? 0 : i % 4);
      double ma, la, mb, lb, m, l;
      exact_state(x, split, ma, la);
      exact_state(x + split, n - split, mb, lb);
      exact_state(x, n, m, l);
      const bool swap = uniform(rng, 0, 1) == 1;
      const float sa[2] = {float(ma), float(la)}, sb[2] = {float(mb), float(lb)};
      for (float v :
           swap ? std::vector<float>{sb[0], sb[1], sa[0], sa[1]} : std::vector<float>{sa[0], sa[1], sb[0], sb[1]})
        c.input.push_back(v);
      want.push_back(m);
      want.push_back(l);
    }
    c.expect_values = std::size_t(pairs) * 2;
    c.judge = [=](const std::vector<float>& out) -> std::string {
      for (int i = 0; i < pairs; ++i) {
        const std::string why =
            judge_state(out[2 * i], out[2 * i + 1], want[2 * i], want[2 * i + 1], "pair " + std::to_string(i));
        if (!why.empty()) return why;
      }
      return "";
    };
    cases.push_back(c);
  }
  return cases;
}

Case forward_case(Rng& rng, const AttentionShape& s, const std::string& task_kernel, DType dtype, double weight,
                  const std::map<std::string, std::string>& extra) {
  Case c;
  c.header.task = "forward";
  c.header.args = extra;
  put_shape(c.header, s);
  c.name = (extra.count("kernel") ? extra.at("kernel") : task_kernel) + " " + s.to_string();
  c.weight = weight;
  std::vector<float> q = rounded(normal(rng, s.q_elems()), dtype), k = rounded(normal(rng, s.kv_elems()), dtype),
                     v = rounded(normal(rng, s.kv_elems()), dtype);
  c.input = q;
  c.input.insert(c.input.end(), k.begin(), k.end());
  c.input.insert(c.input.end(), v.begin(), v.end());
  c.expect_values = std::size_t(s.q_elems() + s.lse_elems());
  c.judge = judge_forward(s, q, k, v, dtype);
  return c;
}

/// The speed part of an exercise: one large shape, run by the reference runner (the instructor's
/// code) and the student's, each timing its own launches; it passes when the student's kernel is
/// right there too and reaches `min_speed` of the reference's speed. `weight`: the speed part's
/// share of the exercise, given the other cases' total weight.
Case speed_case(Rng& rng, const AttentionShape& s, const std::string& kernel, DType dtype, double weight,
                double min_speed) {
  Case c = forward_case(rng, s, "forward", dtype, weight, {{"kernel", kernel}});
  c.name = "speed: " + c.name + ", at least " + fmt(min_speed) + " of the reference solution's speed";
  c.min_speed = min_speed;
  const std::vector<float> q(c.input.begin(), c.input.begin() + s.q_elems()),
      k(c.input.begin() + s.q_elems(), c.input.begin() + s.q_elems() + s.kv_elems()),
      v(c.input.begin() + s.q_elems() + s.kv_elems(), c.input.end());
  c.judge = judge_forward(s, q, k, v, dtype, rng() | 1);
  return c;
}

/// Weight for a speed case worth `share` of an exercise whose other cases are `cases`.
double speed_weight(const std::vector<Case>& cases, double share) {
  double total = 0;
  for (const Case& c : cases) total += c.weight;
  return total * share / (1 - share);
}

/// The trivial shape (weight 0) and `n` drawn ones for each of `variants` (extra header args).
std::vector<Case> forward_cases(Rng& rng, const std::vector<std::map<std::string, std::string>>& variants, DType dtype,
                                int lo, int hi, const std::vector<int>& dims, int n = 3) {
  std::vector<Case> cases;
  for (const auto& extra : variants) {
    AttentionShape one;
    one.head_dim = dims.front();
    cases.push_back(forward_case(rng, one, "forward", dtype, 0, extra));
    for (int i = 0; i < n; ++i)
      cases.push_back(forward_case(rng, draw_shape(rng, lo, hi, dims), "forward", dtype, 1, extra));
  }
  return cases;
}

/// The row step alone, from states the checker draws (chapters 04 and 05's CPU exercises). Each
/// call starts from a state that no tile it saw produced, so only the online update itself gives
/// the answer: a step that keeps earlier tiles and recomputes, or computes the row some other way,
/// cannot. normalized: O kept divided by l (FlashAttention-1); else the unnormalized accumulator
/// (FlashAttention-2). Rows of kinds: a fresh row; a tile under the running max; a tile that
/// raises it; a fully masked tile (the state stays); a fresh row and a masked tile (stays empty);
/// scores shifted by up to +-1e4; fewer keys than columns, the rest of V's tile NaN (not to be
/// read). Judged in double: m exactly, l and O relative to their size.
std::vector<Case> row_step_cases(Rng& rng, bool normalized) {
  std::vector<Case> cases;
  const int shapes[][2] = {{8, 16}, {24, 32}, {64, 64}, {uniform(rng, 9, 63), uniform(rng, 5, 40)}};
  for (const auto& shape : shapes) {
    const int cols = shape[0], d = shape[1], rows = 56;
    Case c;
    c.header.task = "row_step";
    c.header.args = {{"rows", std::to_string(rows)}, {"cols", std::to_string(cols)}, {"d", std::to_string(d)}};
    c.name = "row step from drawn states, " + std::to_string(cols) + " keys, head_dim " + std::to_string(d);
    c.is_step = true;
    std::vector<float> state(std::size_t(rows) * (2 + d)), scores(std::size_t(rows) * cols), keys(rows),
        v = normal(rng, std::size_t(rows) * cols * d);
    std::vector<double> want(std::size_t(rows) * (2 + d));
    for (int r = 0; r < rows; ++r) {
      const int kind = r % 7;
      float* st = state.data() + std::size_t(r) * (2 + d);
      float* sc = scores.data() + std::size_t(r) * cols;
      const double shift = kind == 5 ? double(uniform(rng, -10000, 10000)) : 0.0;
      const std::vector<float> x = normal(rng, cols, 2.0f);
      for (int j = 0; j < cols; ++j) sc[j] = float(x[j] + shift);
      int n = cols;
      if (kind == 6) {
        n = uniform(rng, 1, cols - 1);
        for (int j = n; j < cols; ++j) {
          sc[j] = -INFINITY;
          for (int e = 0; e < d; ++e) v[(std::size_t(r) * cols + j) * d + e] = NAN;
        }
      } else if (r % 3 == 0) {
        for (int j = 0; j < cols; ++j)
          if (uniform(rng, 0, 3) == 0) sc[j] = -INFINITY;  // a few masked keys
      }
      if (kind == 3 || kind == 4)
        for (int j = 0; j < cols; ++j) sc[j] = -INFINITY;
      keys[r] = float(n);
      float tile_max = -INFINITY;
      for (int j = 0; j < cols; ++j) tile_max = std::fmax(tile_max, sc[j]);
      // The state in: empty, or a max m with a sum l >= 1 and outputs o.
      if (kind == 0 || kind == 4) {
        st[0] = -INFINITY;
        st[1] = 0.0f;
        for (int e = 0; e < d; ++e) st[2 + e] = 0.0f;
      } else {
        const double base = tile_max == -INFINITY ? shift : double(tile_max);
        st[0] = float(kind == 1 ? base + uniform(rng, 1, 6) : kind == 2 ? base - uniform(rng, 1, 6) : base + 0.5);
        st[1] = float(1.0 + uniform(rng, 0, 400) / 10.0);
        const std::vector<float> o = normal(rng, d);
        for (int e = 0; e < d; ++e) st[2 + e] = normalized ? o[e] : o[e] * st[1];
      }
      // The state out, in double.
      double* w = want.data() + std::size_t(r) * (2 + d);
      const double m = st[0], m_new = std::max(m, double(tile_max));
      for (int e = 0; e < 2 + d; ++e) w[e] = st[e];
      if (m_new == -INFINITY) continue;
      const double kept = m == -INFINITY ? 0.0 : std::exp(m - m_new);
      double sum = 0;
      std::vector<double> pv(d, 0.0);
      for (int j = 0; j < n; ++j) {
        if (sc[j] == -INFINITY) continue;
        const double p = std::exp(double(sc[j]) - m_new);
        sum += p;
        for (int e = 0; e < d; ++e) pv[e] += p * v[(std::size_t(r) * cols + j) * d + e];
      }
      const double l_new = double(st[1]) * kept + sum;
      w[0] = m_new;
      w[1] = l_new;
      for (int e = 0; e < d; ++e)
        w[2 + e] = normalized ? (double(st[1]) * kept * st[2 + e] + pv[e]) / l_new : st[2 + e] * kept + pv[e];
    }
    c.input = state;
    c.input.insert(c.input.end(), scores.begin(), scores.end());
    c.input.insert(c.input.end(), keys.begin(), keys.end());
    c.input.insert(c.input.end(), v.begin(), v.end());
    c.expect_values = want.size();
    c.judge = [want, rows, d](const std::vector<float>& out) -> std::string {
      for (int r = 0; r < rows; ++r) {
        const float* got = out.data() + std::size_t(r) * (2 + d);
        const double* w = want.data() + std::size_t(r) * (2 + d);
        const std::string where = "row " + std::to_string(r);
        if (w[0] == -INFINITY) {
          if (!(got[0] == -INFINITY && got[1] == 0.0f))
            return where + ": a row with no visible score must stay (m, l) = (-inf, 0), got (" + fmt(got[0]) + ", " +
                   fmt(got[1]) + ")";
        } else if (double(got[0]) != double(float(w[0]))) {
          return where + ": m = " + fmt(got[0]) + ", expected " + fmt(w[0]);
        } else if (!std::isfinite(got[1]) || std::fabs(got[1] - w[1]) > 1e-5 * w[1]) {
          return where + ": l = " + fmt(got[1]) + ", expected " + fmt(w[1]);
        }
        double err = 0, norm = 0;
        for (int e = 0; e < d; ++e) {
          if (!std::isfinite(got[2 + e])) return where + ": o[" + std::to_string(e) + "] is not finite";
          err += (got[2 + e] - w[2 + e]) * (got[2 + e] - w[2 + e]);
          norm += w[2 + e] * w[2 + e];
        }
        if (std::sqrt(err) > 1e-5 * std::sqrt(norm) + 1e-6)
          return where + ": the output's relative error is " + fmt(std::sqrt(err / std::max(norm, 1e-30))) +
                 " (allowed 1e-5)";
      }
      return "";
    };
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> scores_cases(Rng& rng) {
  std::vector<Case> cases;
  for (const char* products : {"per_thread", "tiled"}) {
    for (int i = 0; i < 3; ++i) {
      const AttentionShape s = i == 0 ? AttentionShape{} : draw_shape(rng, 65, 230, {16, 40, 64, 72});
      Case c;
      c.header.task = "scores";
      c.header.args = {{"products", products}};
      put_shape(c.header, s);
      c.name = std::string("scores ") + products + " " + s.to_string();
      c.weight = i == 0 ? 0 : 1;
      const std::vector<float> q = normal(rng, s.q_elems()), k = normal(rng, s.kv_elems());
      c.input = q;
      c.input.insert(c.input.end(), k.begin(), k.end());
      c.expect_values = std::size_t(s.batch) * s.heads_q * s.seq_q * s.seq_kv;
      c.judge = [=](const std::vector<float>& out) -> std::string {
        const double scale = s.softmax_scale();
        std::size_t at = 0;
        for (int bh = 0; bh < s.batch * s.heads_q; ++bh)
          for (int i = 0; i < s.seq_q; ++i)
            for (int j = 0; j < s.seq_kv; ++j, ++at) {
              const std::string where =
                  "S[" + std::to_string(bh) + "][" + std::to_string(i) + "][" + std::to_string(j) + "]";
              if (!s.visible(i, j)) {
                if (out[at] != -INFINITY) return where + " is masked and must be -inf, got " + fmt(out[at]);
                continue;
              }
              double dot = 0, mag = 0;
              for (int x = 0; x < s.head_dim; ++x) {
                const double a = q[s.q_head_offset(bh) + int64_t(i) * s.head_dim + x];
                const double b = k[s.kv_head_offset(bh) + int64_t(j) * s.head_dim + x];
                dot += a * b;
                mag += std::fabs(a * b);
              }
              if (!(std::fabs(out[at] - dot * scale) <= 1e-5 * mag * scale + 1e-6))
                return where + " = " + fmt(out[at]) + ", expected " + fmt(dot * scale);
            }
        return "";
      };
      cases.push_back(c);
    }
  }
  return cases;
}

std::vector<Case> tail_pieces_cases(Rng& rng) {
  std::vector<Case> cases;
  for (int round = 0; round < 3; ++round) {
    Case c;
    const int n = round == 0 ? 1 : 500;
    c.name = "tail_pieces n=" + std::to_string(n);
    c.weight = round == 0 ? 0 : 1;
    c.header.task = "tail_pieces";
    c.header.args = {{"n", std::to_string(n)}};
    std::vector<int> want;
    for (int i = 0; i < n; ++i) {
      const int slots = round == 0 ? 132 : uniform(rng, 1, 300);
      const int blocks = round == 0 ? 132 : uniform(rng, 0, 4 * slots + 7);
      const int tiles = uniform(rng, 1, 200);
      c.input.insert(c.input.end(), {float(blocks), float(slots), float(tiles)});
      want.push_back(flash3::tail_pieces(blocks, slots, tiles));  // the instructor's
    }
    c.expect_values = std::size_t(n);
    const std::vector<float> in = c.input;
    c.judge = [=](const std::vector<float>& out) -> std::string {
      for (int i = 0; i < n; ++i)
        if (out[i] != float(want[i]))
          return "tail_pieces(" + fmt(in[3 * i]) + ", " + fmt(in[3 * i + 1]) + ", " + fmt(in[3 * i + 2]) +
                 ") = " + fmt(out[i]) + ", expected " + std::to_string(want[i]);
      return "";
    };
    cases.push_back(c);
  }
  return cases;
}

Case backward_case(Rng& rng, const AttentionShape& s, const std::string& kernel, DType dtype, double weight) {
  Case c;
  c.header.task = "backward";
  if (!kernel.empty()) c.header.args["kernel"] = kernel;
  put_shape(c.header, s);
  c.name = (kernel.empty() ? std::string("backward") : kernel) + " " + s.to_string();
  c.weight = weight;
  const std::vector<float> q = rounded(normal(rng, s.q_elems()), dtype), k = rounded(normal(rng, s.kv_elems()), dtype),
                           v = rounded(normal(rng, s.kv_elems()), dtype),
                           d_o = rounded(normal(rng, s.q_elems()), dtype);
  const BackwardReference ref = reference_backward(s, q.data(), k.data(), v.data(), d_o.data());
  std::vector<float> o(ref.o.begin(), ref.o.end()), lse(ref.lse.begin(), ref.lse.end());
  o = rounded(o, dtype);
  c.input = q;
  for (const std::vector<float>* part : std::initializer_list<const std::vector<float>*>{&k, &v, &o, &lse, &d_o})
    c.input.insert(c.input.end(), part->begin(), part->end());
  c.expect_values = std::size_t(s.q_elems() + 2 * s.kv_elems());
  const double tol = dtype == DType::F32 ? 2e-4 : 2e-2;
  c.judge = [=](const std::vector<float>& out) -> std::string {
    const std::size_t nq = s.q_elems(), nk = s.kv_elems();
    std::string why = close_enough("dQ", out.data(), ref.dq.data(), nq, tol);
    if (why.empty()) why = close_enough("dK", out.data() + nq, ref.dk.data(), nk, tol);
    if (why.empty()) why = close_enough("dV", out.data() + nq + nk, ref.dv.data(), nk, tol);
    return why;
  };
  return c;
}

std::vector<Case> backward_cases(Rng& rng, const std::string& kernel, DType dtype, const std::vector<int>& dims) {
  std::vector<Case> cases;
  AttentionShape one;
  one.head_dim = dims.front();
  cases.push_back(backward_case(rng, one, kernel, dtype, 0));
  for (int i = 0; i < 4; ++i) cases.push_back(backward_case(rng, draw_shape(rng, 65, 200, dims), kernel, dtype, 1));
  return cases;
}

Case decode_case(Rng& rng, const std::string& kernel, DType dtype, int d, int max_len, bool trivial) {
  Case c;
  const int block_size = 16, seqs = trivial ? 1 : uniform(rng, 2, 5), heads_kv = uniform(rng, 1, 2);
  const int heads_q = heads_kv * (trivial ? 1 : uniform(rng, 1, 4));
  std::vector<int> lens(seqs);
  for (int s = 0; s < seqs; ++s) lens[s] = trivial ? 1 : (s == 0 ? 0 : s == 1 ? 1 : uniform(rng, 2, max_len));
  int max_blocks = 1, total_blocks = 0, max_context = 0;
  for (int len : lens) {
    max_blocks = std::max(max_blocks, (len + block_size - 1) / block_size);
    total_blocks += (len + block_size - 1) / block_size;
    max_context = std::max(max_context, len);
  }
  const int num_blocks = std::max(1, total_blocks + 3);
  std::vector<int> pool(num_blocks);
  for (int i = 0; i < num_blocks; ++i) pool[i] = i;
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<std::vector<int>> tables(seqs);
  std::vector<float> table_in;
  int next = 0;
  for (int s = 0; s < seqs; ++s) {
    for (int b = 0; b < max_blocks; ++b) {
      const bool used = b < (lens[s] + block_size - 1) / block_size;
      const int block = used ? pool[next++] : 0;
      if (used) tables[s].push_back(block);
      table_in.push_back(float(block));
    }
  }
  const std::size_t cache = std::size_t(num_blocks) * heads_kv * block_size * d;
  const std::vector<float> q = rounded(normal(rng, std::size_t(seqs) * heads_q * d), dtype),
                           kc = rounded(normal(rng, cache), dtype), vc = rounded(normal(rng, cache), dtype);
  c.header.task = "decode";
  if (!kernel.empty()) c.header.args["kernel"] = kernel;
  c.header.args.insert({{"seqs", std::to_string(seqs)},
                        {"hq", std::to_string(heads_q)},
                        {"hkv", std::to_string(heads_kv)},
                        {"d", std::to_string(d)},
                        {"block_size", std::to_string(block_size)},
                        {"blocks", std::to_string(num_blocks)},
                        {"max_blocks", std::to_string(max_blocks)},
                        {"max_context", std::to_string(max_context)},
                        {"partition", std::to_string(block_size * uniform(rng, 1, 8))}});
  c.input = q;
  for (const std::vector<float>* part : std::initializer_list<const std::vector<float>*>{&kc, &vc, &table_in})
    c.input.insert(c.input.end(), part->begin(), part->end());
  for (int len : lens) c.input.push_back(float(len));
  c.expect_values = std::size_t(seqs) * heads_q * (d + 1);
  c.name = (kernel.empty() ? std::string("decode") : kernel) + " seqs=" + std::to_string(seqs) + " h" +
           std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " d" + std::to_string(d) +
           " ctx<=" + std::to_string(max_context);
  c.weight = trivial ? 0 : 1;
  const double tol = dtype == DType::F32 ? 1e-5 : dtype == DType::BF16 ? 2e-2 : 4e-3;
  c.judge = [=](const std::vector<float>& out) -> std::string {
    PagedKvView view;
    view.num_blocks = num_blocks;
    view.block_size = block_size;
    view.heads_kv = heads_kv;
    view.head_dim = d;
    view.k = kc.data();
    view.v = vc.data();
    const DecodeReference ref = reference_paged_decode(view, heads_q, q.data(), tables, lens);
    const std::size_t no = std::size_t(seqs) * heads_q * d;
    for (std::size_t r = 0; r < std::size_t(seqs) * heads_q; ++r) {
      const float got = out[no + r];
      const double want = ref.lse[r];
      if (want == -INFINITY) {
        if (got != -INFINITY) return "row " + std::to_string(r) + " sees no key: LSE must be -inf, got " + fmt(got);
        for (int x = 0; x < d; ++x)
          if (out[r * d + x] != 0.0f) return "row " + std::to_string(r) + " sees no key: O must be 0";
      } else if (!(std::fabs(got - want) <= 1e-2)) {
        return "row " + std::to_string(r) + ": LSE = " + fmt(got) + ", expected " + fmt(want);
      }
    }
    return close_enough("O", out.data(), ref.o.data(), no, tol);
  };
  return c;
}

std::vector<Case> block_manager_cases(Rng& rng) {
  std::vector<Case> cases;
  for (int round = 0; round < 4; ++round) {
    // A weighted script must make the instructor's manager copy on write at least once: without
    // a copy, a stub that throws on the copy (or skips it) gives the same trace. Scripts are
    // drawn until one does; block_size 1 never copies (a block is full after one token).
    Case c;
    int copies_made = 0;
    do {
      c = Case{};
      copies_made = 0;
      const int blocks = round == 0 ? 4 : uniform(rng, 6, 40), block_size = 1 << uniform(rng, round == 0 ? 0 : 1, 4);
      const int ops = round == 0 ? 2 : uniform(rng, 60, 200);
      c.header.task = "block_manager";
      c.header.args = {
          {"blocks", std::to_string(blocks)}, {"block_size", std::to_string(block_size)}, {"ops", std::to_string(ops)}};
      c.name = "block_manager blocks=" + std::to_string(blocks) + " block_size=" + std::to_string(block_size) +
               " ops=" + std::to_string(ops);
      c.weight = round == 0 ? 0 : 1;
      // The trace the instructor's BlockManager gives for the same script.
      paged::BlockManager bm(blocks, block_size);
      std::vector<float> want;
      int next_id = 0;
      for (int i = 0; i < ops; ++i) {
        int op = round == 0 ? (i == 0 ? 0 : 2) : uniform(rng, 0, 9);
        op = op == 0 ? 0 : op <= 2 ? 1 : op <= 7 ? 2 : 3;
        if (next_id == 0) op = 0;
        const int a = next_id ? uniform(rng, 0, next_id - 1) : 0,
                  b = round == 0 ? 1 : uniform(rng, 0, 2 * block_size + 1);
        c.input.insert(c.input.end(), {float(op), float(a), float(b)});
        try {
          if (op == 0) next_id = bm.add_sequence() + 1;
          else if (op == 1) next_id = bm.fork(a) + 1;
          else if (op == 2) bm.append(a, b);
          else bm.release(a);
          want.push_back(1.0f);
        } catch (const std::exception&) {
          want.push_back(0.0f);
        }
        if (op == 2) {
          const auto copies = bm.take_copies();
          copies_made += int(copies.size());
          want.push_back(float(copies.size()));
          for (const auto& cp : copies) want.insert(want.end(), {float(cp.from), float(cp.to)});
        }
      }
      for (int seq : bm.sequences()) {
        want.insert(want.end(), {float(seq), float(bm.length(seq)), float(bm.block_table(seq).size())});
        for (int b : bm.block_table(seq)) want.push_back(float(b));
      }
      want.push_back(float(bm.free_blocks()));
      c.expect_values = 0;  // the trace's length depends on what happened
      c.judge = [=](const std::vector<float>& out) -> std::string {
        const std::size_t n = std::min(out.size(), want.size());
        for (std::size_t i = 0; i < n; ++i)
          if (out[i] != want[i])
            return "the trace differs from the expected one at value " + std::to_string(i) + " (got " + fmt(out[i]) +
                   ", expected " + fmt(want[i]) +
                   "): tables, copies or free blocks are not what fork/append/release give";
        if (out.size() != want.size())
          return "the trace has " + std::to_string(out.size()) + " values, expected " + std::to_string(want.size());
        return "";
      };
    } while (round > 0 && copies_made == 0);
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> cases_for(const std::string& id, Rng& rng) {
  using M = std::map<std::string, std::string>;
  if (id == "ch01_scores_cpu") return scores_cases(rng);
  if (id == "ch01_scores") return forward_cases(rng, {M{{"kernel", "ch01_naive"}}}, DType::F32, 65, 300, {32, 64, 80});
  if (id == "ch02_safe_row_cpu") return softmax_row_cases(rng, "safe_row");
  if (id == "ch02_block_softmax")
    return forward_cases(rng, {M{{"kernel", "ch02_block"}}}, DType::F32, 65, 700, {32, 64, 128});
  if (id == "ch03_online_update") return softmax_row_cases(rng, "online_update");
  if (id == "ch03_online_merge") return merge_cases(rng);
  // The CPU row steps: judged alone from drawn states (the algorithm), and through the chapter's
  // whole loop (the output), each half of the points; the whole loop's cases count only when the
  // step passed every drawn state, so an answer that is not the online update scores nothing.
  auto steps_and_forward = [&](bool normalized, std::vector<Case> forward) {
    std::vector<Case> cases = row_step_cases(rng, normalized);
    double steps = 0, whole = 0;
    for (const Case& c : cases) steps += c.weight;
    for (const Case& c : forward) whole += c.weight;
    for (Case& c : forward) {
      c.weight *= steps / whole;
      c.needs_steps = true;
    }
    cases.insert(cases.end(), forward.begin(), forward.end());
    return cases;
  };
  if (id == "ch04_row_update_cpu")
    return steps_and_forward(true, forward_cases(rng, {M{{"order", "kv_outer"}}, M{{"order", "q_outer"}}}, DType::F32,
                                                 65, 260, {16, 32, 64}, 2));
  // The speed cases: a fifth of the exercise for 0.7 of the reference solution's speed.
  auto with_speed = [&](std::vector<Case> cases, const std::string& kernel, DType dtype, AttentionShape s) {
    const double w = speed_weight(cases, 0.2);
    cases.push_back(speed_case(rng, s, kernel, dtype, w, 0.7));
    return cases;
  };
  auto big = [](int heads, int seq, int d) {
    AttentionShape s;
    s.heads_q = s.heads_kv = heads;
    s.seq_q = s.seq_kv = seq;
    s.head_dim = d;
    return s;
  };
  if (id == "ch04_row_update")
    return with_speed(forward_cases(rng,
                                    {M{{"kernel", "ch04_kv_outer"}}, M{{"kernel", "ch04_q_outer"}},
                                     M{{"kernel", "ch04_registers"}}, M{{"kernel", "ch04_tuned"}}},
                                    DType::F32, 65, 600, {64, 128}, 2),
                      "ch04_registers", DType::F32, big(8, 2048, 64));
  if (id == "ch05_tile_cpu")
    return steps_and_forward(false, forward_cases(rng, {M{}}, DType::F32, 65, 260, {16, 32, 64}));
  if (id == "ch05_pv") {
    std::vector<Case> cases =
        forward_cases(rng, {M{{"kernel", "ch05_tuned_bf16"}}}, DType::BF16, 65, 700, {64, 96, 128, 256}, 2);
    const std::vector<Case> mma =
        forward_cases(rng, {M{{"kernel", "ch05_mma_bf16"}}}, DType::BF16, 65, 700, {64, 128}, 2);
    cases.insert(cases.end(), mma.begin(), mma.end());
    const std::vector<Case> fp16 =
        forward_cases(rng, {M{{"kernel", "ch05_pipelined_fp16"}}, M{{"kernel", "ch05_kv_split_fp16"}}}, DType::F16, 65,
                      700, {64, 128}, 2);
    cases.insert(cases.end(), fp16.begin(), fp16.end());
    return with_speed(cases, "ch05_tuned_bf16", DType::BF16, big(16, 4096, 128));
  }
  // Chapter 06: at least 400 keys, so the producer refills stages (more tiles than the ring's 2).
  if (id == "ch06_producer")
    return with_speed(forward_cases(rng, {M{{"kernel", "ch06_specialized_bf16"}}, M{{"kernel", "ch06_pingpong_bf16"}}},
                                    DType::BF16, 400, 2500, {64, 128}, 3),
                      "ch06_pingpong_bf16", DType::BF16, big(16, 4096, 128));
  if (id == "ch06_tail_pieces") return tail_pieces_cases(rng);
  if (id == "ch07_ds_cpu") return backward_cases(rng, "", DType::F32, {16, 32, 64});
  if (id == "ch07_ds") return backward_cases(rng, "ch07_fp32", DType::F32, {32, 64, 128});
  if (id == "ch08_cow_cpu") return block_manager_cases(rng);
  if (id == "ch08_merge_cpu" || id == "ch08_merge") {
    const bool gpu = id == "ch08_merge";
    const std::string kernel = gpu ? "ch08_split_kv_bf16" : "";
    const DType dtype = gpu ? DType::BF16 : DType::F32;
    std::vector<Case> cases = {decode_case(rng, kernel, dtype, 64, 1, true)};
    for (int i = 0; i < 4; ++i)
      cases.push_back(decode_case(rng, kernel, dtype, i % 2 ? 128 : 64, gpu ? 9000 : 700, false));
    return cases;
  }
  throw std::runtime_error("the checker knows no exercise '" + id + "'");
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += char(c);
    else if (c == '\n') out += "\\n";
    else if (c < 0x20 || c >= 0x7f) out += ' ';
    else out += char(c);
  }
  return out + "\"";
}

/// "" when the runner's answer to `c` is right, else why not.
std::string judged(const Case& c, const Reply& r) {
  if (!r.ok) return r.error;
  if (c.expect_values && r.out.size() != c.expect_values)
    return "the runner answered " + std::to_string(r.out.size()) + " values, expected " +
           std::to_string(c.expect_values);
  try {
    return c.judge(r.out);
  } catch (const std::exception& e) {
    return std::string("could not judge the answer: ") + e.what();
  }
}

/// A speed case: the reference runner and the student's, alternately, twice each, each timing
/// its own launches (CUDA events, the median of a launch count drawn here, so a kernel cannot
/// tell which launch is the last; the runner poisons the outputs again before the last, whose
/// outputs are judged). The best time of each counts. A time below what the runner's own
/// wall-clock time allows is not believed. Returns why not ("" when fast enough); `note` says
/// what was measured.
std::string check_speed(const Options& opt, const Case& c, Rng& rng, std::string& note) {
  if (opt.reference_runner.empty())
    return "not measured: no reference solution here to time against (a student copy's self-check leaves the speed "
           "part out)";
  double best[2] = {INFINITY, INFINITY};
  for (int round = 0; round < 2; ++round)
    for (int who = 0; who < 2; ++who) {
      Header h = c.header;
      h.args["time"] = "1";
      h.args["iters"] = std::to_string(uniform(rng, 20, 40));
      const Reply r = ask(opt, who == 0 ? opt.reference_runner : opt.runner, h, c.input, c.expect_values);
      const std::string why = judged(c, r);
      if (!why.empty()) return who == 0 ? "the reference solution failed here (an instructor's problem): " + why : why;
      if (!(r.ms > 0) || r.iters < 20 || r.wall_ms < 0.9 * r.ms * r.iters)
        return "the runner's time (" + fmt(r.ms) + " ms x " + std::to_string(r.iters) +
               ") does not fit its wall-clock time (" + fmt(r.wall_ms) + " ms)";
      best[who] = std::min(best[who], r.ms);
    }
  const double speed = best[0] / best[1];
  note = "reference " + fmt(best[0]) + " ms, yours " + fmt(best[1]) + " ms: " + fmt(speed) + " of its speed";
  return speed >= c.min_speed ? "" : "too slow: " + note + " (at least " + fmt(c.min_speed) + " earns this part)";
}

int check(const Options& opt) {
  Rng rng(opt.seed);
  if (opt.student_copy && (opt.exercise == "ch06_tail_pieces" || opt.exercise == "ch08_cow_cpu")) {
    // These cases take their expected answers from the solution itself, which a student copy holds
    // only as the student's own code.
    std::fputs(("{\"exercise\": " + json_string(opt.exercise) +
                ", \"cases\": [{\"name\": \"self-check\", \"weight\": 1, \"passed\": false, \"detail\": \"not "
                "checked in a student copy: the checker takes this exercise's expected answers from the reference "
                "solution, which only the instructor's grader has; the visible tests still check it\", \"note\": "
                "\"\"}]}\n")
                   .c_str(),
               stdout);
    return 0;
  }
  const std::vector<Case> cases = cases_for(opt.exercise, rng);
  std::string json = "{\"exercise\": " + json_string(opt.exercise) + ", \"cases\": [";
  bool timed_out = false, steps_failed = false;
  std::vector<std::string> whys(cases.size()), notes(cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (timed_out) {
      whys[i] = "not run: an earlier case ran past the time limit";
    } else if (c.min_speed > 0) {
      whys[i] = check_speed(opt, c, rng, notes[i]);
    } else {
      const Reply r = ask(opt, opt.runner, c.header, c.input, c.expect_values);
      whys[i] = judged(c, r);
      timed_out = r.timed_out;
    }
    if (c.is_step && !whys[i].empty()) steps_failed = true;
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string why = whys[i];
    if (c.needs_steps && steps_failed && why.empty())
      why = "not counted: the row step failed on a drawn state, so this output is not the online update's";
    json += std::string(i ? ", " : "") + "{\"name\": " + json_string(c.name) + ", \"weight\": " + fmt(c.weight) +
            ", \"passed\": " + (why.empty() ? "true" : "false") + ", \"detail\": " + json_string(why.substr(0, 600)) +
            ", \"note\": " + json_string(notes[i]) + "}";
  }
  json += "]";
  json += "}\n";
  std::fputs(json.c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace fa::grader

int main(int argc, char** argv) {
  using namespace fa::grader;
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fa_check: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--exercise") opt.exercise = value();
    else if (a == "--runner") opt.runner = value();
    else if (a == "--reference-runner") opt.reference_runner = value();
    else if (a == "--seed") opt.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--timeout") opt.timeout_s = std::atof(value().c_str());
    else if (a == "--uid") opt.uid = std::atoi(value().c_str());
    else if (a == "--student-copy") opt.student_copy = true;
    else {
      std::fprintf(stderr, "fa_check: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  // grade.py passes the seed in the environment, which other users cannot read (a command line
  // they can); the runner gets an empty environment.
  if (const char* seed = std::getenv("FA_CHECK_SEED")) opt.seed = std::strtoull(seed, nullptr, 10);
  unsetenv("FA_CHECK_SEED");
  if (opt.exercise.empty() || opt.runner.empty() || opt.timeout_s <= 0) {
    std::fprintf(stderr, "fa_check: give --exercise ID --runner PATH (and --timeout > 0)\n");
    return 2;
  }
  prctl(PR_SET_DUMPABLE, 0);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  signal(SIGPIPE, SIG_IGN);
  try {
    return check(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fa_check: %s\n", e.what());
    return 1;
  }
}
