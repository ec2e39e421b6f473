// A runner confines itself before it runs a line of the student's code: a seccomp filter, so
// that whatever the region code does at run time (calls into libc found through a pointer, a
// system call in inline assembly), the process can compute and write to the pipes it already
// holds, and nothing else. The lint and the compiler's reading keep names out of the regions;
// this keeps the behaviour out, whatever the names.
//
// The CPU runner gets an allowlist: memory, threads, time, signals to itself, reading and
// writing its open descriptors. Any other system call fails with EPERM (opening a file, making a
// folder, starting a process, a socket); clone3 fails with ENOSYS, so that glibc starts threads
// with clone, whose flags the filter can read (a new thread is allowed, a new process is not).
// The GPU runner initializes CUDA first (every device file it needs is then open, every module
// loaded), then gets a denylist: the calls that open, create or change files by name, start
// processes or programs, open sockets, or touch other processes fail with EPERM; the driver's
// ioctls, mappings and stat calls go on (so a file's existence and size, never its contents,
// stay visible to it). Neither runner can reach the machine's other shared stores (keyrings,
// POSIX and System V queues, semaphores and shared memory), so nothing it does outlives it. The filter covers every thread of the process (TSYNC) and cannot be lifted
// (no_new_privs). A runner that cannot install it stops before the student's code runs.
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace fa::grader {

enum class Confinement { Cpu, Gpu };

namespace confine_detail {

#if defined(__x86_64__)
constexpr unsigned kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kArch = AUDIT_ARCH_AARCH64;
#else
#error "the runner's seccomp filter knows x86-64 and aarch64"
#endif

constexpr unsigned kNr = offsetof(seccomp_data, nr), kArchAt = offsetof(seccomp_data, arch),
                   kArg0Low = offsetof(seccomp_data, args);  // little-endian: the low 32 bits of args[0]

inline sock_filter stmt(unsigned short code, unsigned k) { return BPF_STMT(code, k); }
inline sock_filter jump(unsigned short code, unsigned k, unsigned char jt, unsigned char jf) {
  return BPF_JUMP(code, k, jt, jf);
}

/// The system calls the CPU runner may make once it has read its request.
inline std::vector<long> cpu_allowed() {
  return {
      SYS_read,
      SYS_write,
      SYS_writev,
      SYS_close,
      SYS_lseek,  // its pipes
      SYS_mmap,
      SYS_munmap,
      SYS_mremap,
      SYS_mprotect,
      SYS_brk,
      SYS_madvise,  // memory
      SYS_futex,
      SYS_sched_yield,
      SYS_sched_getaffinity,
      SYS_set_robust_list,
      SYS_rseq,  // threads
      SYS_gettid,
      SYS_getpid,
      SYS_exit,
      SYS_exit_group,
      SYS_tgkill,  // itself
      SYS_rt_sigaction,
      SYS_rt_sigprocmask,
      SYS_rt_sigreturn,
      SYS_sigaltstack,  // signals
      SYS_clock_gettime,
      SYS_clock_nanosleep,
      SYS_nanosleep,
      SYS_gettimeofday,
      SYS_getrandom,  // time
  };
}

/// The system calls the GPU runner may not make once CUDA is up.
inline std::vector<long> gpu_denied() {
  return {
#ifdef SYS_open
      SYS_open,
      SYS_creat,
      SYS_mkdir,
      SYS_rmdir,
      SYS_unlink,
      SYS_rename,
      SYS_link,
      SYS_symlink,
      SYS_chmod,
      SYS_chown,
      SYS_lchown,
      SYS_readlink,
      SYS_utime,
      SYS_fork,
      SYS_vfork,
      SYS_utimes,
      SYS_mknod,
#endif
      SYS_openat,
      SYS_openat2,
      SYS_mkdirat,
      SYS_unlinkat,
      SYS_renameat,
      SYS_renameat2,
      SYS_linkat,
      SYS_symlinkat,
      SYS_fchmodat,
      SYS_fchownat,
      SYS_readlinkat,
      SYS_truncate,
      SYS_chdir,
      SYS_fchdir,
      SYS_chroot,
      SYS_mknodat,
      SYS_utimensat,
      SYS_name_to_handle_at,
      SYS_open_by_handle_at,
      SYS_execve,
      SYS_execveat,
      SYS_socket,
      SYS_socketpair,
      SYS_connect,
      SYS_bind,
      SYS_ptrace,
      SYS_process_vm_readv,
      SYS_process_vm_writev,
      SYS_kill,
      SYS_mount,
      SYS_umount2,
      SYS_pivot_root,
      SYS_unshare,
      SYS_setns,
      SYS_io_uring_setup,
      SYS_inotify_init1,
      SYS_fanotify_init,
      SYS_memfd_create,
      SYS_pidfd_open,
      SYS_add_key,
      SYS_request_key,
      SYS_keyctl,
      SYS_mq_open,
      SYS_mq_unlink,
      SYS_mq_timedsend,
      SYS_mq_timedreceive,
      SYS_mq_notify,
      SYS_mq_getsetattr,
      SYS_msgget,
      SYS_msgsnd,
      SYS_msgrcv,
      SYS_msgctl,
      SYS_semget,
      SYS_semop,
      SYS_semtimedop,
      SYS_semctl,
      SYS_shmget,
      SYS_shmat,
      SYS_shmctl,
      SYS_bpf,
      SYS_perf_event_open,
      SYS_userfaultfd,
      SYS_pidfd_send_signal,
      SYS_process_madvise,
      SYS_tkill,
      SYS_rt_sigqueueinfo,
      SYS_rt_tgsigqueueinfo,
      SYS_setxattr,
      SYS_lsetxattr,
      SYS_removexattr,
      SYS_lremovexattr,
      SYS_futimesat,
      SYS_pidfd_getfd,
      SYS_setsid,
      SYS_setpgid,
  };
}

inline std::vector<sock_filter> program(Confinement kind) {
  constexpr unsigned kAllow = SECCOMP_RET_ALLOW, kEperm = SECCOMP_RET_ERRNO | EPERM,
                     kEnosys = SECCOMP_RET_ERRNO | ENOSYS;
  std::vector<sock_filter> f;
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArchAt));
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0));
  f.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kNr));
#if defined(__x86_64__)
  f.push_back(jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1));  // the x32 numbers
  f.push_back(stmt(BPF_RET | BPF_K, kEperm));
#endif
  // clone3's flags are behind a pointer the filter cannot read: ENOSYS, and glibc uses clone.
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, unsigned(SYS_clone3), 0, 1));
  f.push_back(stmt(BPF_RET | BPF_K, kEnosys));
  // clone: a thread (CLONE_THREAD) is allowed, a process is not.
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, unsigned(SYS_clone), 0, 4));
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArg0Low));
  f.push_back(jump(BPF_JMP | BPF_JSET | BPF_K, unsigned(CLONE_THREAD), 0, 1));
  f.push_back(stmt(BPF_RET | BPF_K, kAllow));
  f.push_back(stmt(BPF_RET | BPF_K, kEperm));
  const std::vector<long> list = kind == Confinement::Cpu ? cpu_allowed() : gpu_denied();
  const unsigned hit = kind == Confinement::Cpu ? kAllow : kEperm, miss = kind == Confinement::Cpu ? kEperm : kAllow;
  for (long nr : list) {
    f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, unsigned(nr), 0, 1));
    f.push_back(stmt(BPF_RET | BPF_K, hit));
  }
  f.push_back(stmt(BPF_RET | BPF_K, miss));
  return f;
}

}  // namespace confine_detail

/// Installs the filter for `kind` on every thread of this process; throws if it cannot.
inline void confine(Confinement kind) {
  // stdout's buffer now, so that stdio never asks the kernel about the descriptor (fstat, ioctl)
  // under the filter.
  static char out_buffer[1 << 16];
  std::setvbuf(stdout, out_buffer, _IOFBF, sizeof(out_buffer));
  std::vector<sock_filter> filter = confine_detail::program(kind);
  sock_fprog prog{static_cast<unsigned short>(filter.size()), filter.data()};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    throw std::runtime_error(std::string("the runner could not set no_new_privs: ") + std::strerror(errno));
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0)
    throw std::runtime_error(std::string("the runner could not install its seccomp filter: ") + std::strerror(errno));
}

}  // namespace fa::grader
