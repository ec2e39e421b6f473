// The grader's CPU runner: one chapter's algorithm.h (the student's code) and nothing else. It
// reads one request from stdin (protocol.h), computes the outputs with the chapter's functions
// and writes them to stdout. It holds no oracle and no other chapter's code: classroom/grade.py
// builds it once per chapter with g++ from the grader's copy of the tree, where only the
// exercises' regions come from the student, naming that chapter's tasks file,
// -DFA_RUNNER_TASKS="tasks/cpu_chNN.h", which includes the chapter's code and defines
// run_chapter_task.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "problem.h"
#include "protocol.h"

#ifndef FA_RUNNER_TASKS
#error "build with -DFA_RUNNER_TASKS=\"tasks/cpu_chNN.h\", the tasks of the chapter to grade"
#endif
#include FA_RUNNER_TASKS

namespace fa::grader {
namespace {

std::vector<float> run(const Header& h, const std::vector<float>& in) {
  std::vector<float> out;
  if (run_chapter_task(h, in, out)) return out;
  throw std::runtime_error("chapter " + std::to_string(kRunnerChapter) + "'s runner has no task '" + h.task + "'");
}

}  // namespace
}  // namespace fa::grader

int main() {
  return fa::grader::serve([](const fa::grader::Header& h,
                              const std::vector<float>& in) { return fa::grader::Answer{fa::grader::run(h, in)}; },
                           fa::grader::Confinement::Cpu);
}
