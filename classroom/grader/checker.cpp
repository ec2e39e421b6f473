// The grader's checker: built from the instructor's tree (never from a student's), linked with
// the fp64 oracle and with no student code. For one exercise it draws the inputs at grading time
// (a fresh seed, shapes drawn at random beyond the visible tests'), runs the student's runner
// once per case in a process of its own (protocol.h, runner_process.h), and compares what comes
// back with the oracle. It trusts nothing the runner says but its output values: not its exit
// code, not its words, not its files. Its verdict (JSON on stdout) is what classroom/grade.py
// scores.
//
//   fa_check --exercise ID --runner PATH [--reference-runner PATH [--reference-uid N]] [--seed N] [--timeout S]
//            [--memory-mb N]
//            [--uid U] [--student-copy]
//   fa_check --list      the exercise ids it has cases for
//
// Each exercise's cases come from the generator registered under its id (cases.h; one file per
// chapter in cases/). The runner runs as runner_process.h says: as root as user U (default
// 65534, "nobody"), every process of which is killed after each case. The reference runner (the
// speed parts) runs as user N, a second user of the grading's, so that the student's runner,
// which runs as U, can neither read nor run the reference solution. The checker itself is not
// dumpable, so a runner of the same user cannot read its memory, and is a subreaper, so the
// orphans it adopts are killed too.
#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "answers.h"
#include "cases.h"
#include "protocol.h"
#include "runner_process.h"

namespace fa::grader {
namespace {

struct Options {
  std::string exercise, runner, reference_runner;
  uint64_t seed = 0;
  RunLimits limits;
  int reference_uid = -1;     // as root, the user the reference runner runs as (not the student's)
  bool student_copy = false;  // built from a handout: no reference solution in it
};

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

/// "" when the runner's answer to `c` is right, else why not. `timed`: the answer of a timed run,
/// whose launch had Q scaled by r.q_scale (a speed case's judge_scaled).
std::string judged(const Case& c, const Reply& r, bool timed = false) {
  if (!r.ok) return r.error.empty() ? "the runner failed without a message" : r.error;  // never "" (passed)
  if (c.expect_values && r.out.size() != c.expect_values)
    return "the runner answered " + std::to_string(r.out.size()) + " values, expected " +
           std::to_string(c.expect_values);
  try {
    if (timed && c.judge_scaled) return c.judge_scaled(r.out, r.q_scale);
    return c.judge(r.out);
  } catch (const std::exception& e) {
    return std::string("could not judge the answer: ") + e.what();
  }
}

/// A speed case: the reference runner and the student's, alternately, twice each, each timing
/// its own launches (runner_gpu.cu's time_ms, the median of a launch count drawn here; Q is scaled by
/// a fresh factor before each launch, and the outputs judged are those of one timed launch, which
/// the runner draws after it ran, against Q times its factor). The best time of each counts. A time below what the runner's own
/// wall-clock time allows is not believed. Returns why not ("" when fast enough); `note` says
/// what was measured.
std::string check_speed(const Options& opt, const Case& c, Rng& rng, std::string& note, double& speed) {
  if (opt.reference_runner.empty())
    return "not measured: no reference solution here to time against (a student copy's self-check leaves the speed "
           "part out)";
  double best[2] = {INFINITY, INFINITY};
  for (int round = 0; round < 2; ++round)
    for (int who = 0; who < 2; ++who) {
      Header h = c.header;
      h.args["time"] = "1";
      h.args["iters"] = std::to_string(uniform(rng, 20, 40));
      RunLimits limits = opt.limits;
      if (who == 0 && opt.reference_uid >= 0) limits.uid = opt.reference_uid;
      const Reply r = ask(limits, who == 0 ? opt.reference_runner : opt.runner, h, c.input, c.expect_values);
      const std::string why = judged(c, r, true);
      if (!why.empty()) return who == 0 ? "the reference solution failed here (an instructor's problem): " + why : why;
      if (!(r.ms > 0) || r.iters < 20 || r.wall_ms < 0.9 * r.ms * r.iters)
        return "the runner's time (" + fmt(r.ms) + " ms x " + std::to_string(r.iters) +
               ") does not fit its wall-clock time (" + fmt(r.wall_ms) + " ms)";
      best[who] = std::min(best[who], r.ms);
    }
  speed = best[0] / best[1];
  note = "reference " + fmt(best[0]) + " ms, yours " + fmt(best[1]) + " ms: " + fmt(speed) + " of its speed";
  return speed >= c.min_speed ? "" : "too slow: " + note + " (at least " + fmt(c.min_speed) + " earns this part)";
}

int check(const Options& opt) {
  const ExerciseCases& exercise = find_exercise_cases(opt.exercise);
  Rng rng(opt.seed);
  if (opt.student_copy && exercise.answers == Answers::FromSolution) {
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
  const std::vector<Case> cases = exercise.make(rng);
  std::string json = "{\"exercise\": " + json_string(opt.exercise) + ", \"cases\": [";
  bool timed_out = false, steps_failed = false;
  std::string gate_failed;  // why no case counts: a gated speed case well below the reference, a gating case failed
  std::vector<std::string> whys(cases.size()), notes(cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (c.from_answers && !answers_available()) {
      // A student copy: the answers to the steps are the instructor's (answers.h).
      whys[i] =
          "not checked in a student copy: the expected answers of this case are the step itself, which only "
          "the instructor's grader holds; the visible tests still check it";
      continue;
    }
    if (timed_out) {
      whys[i] = "not run: an earlier case ran past the time limit";
    } else if (c.min_speed > 0) {
      double speed = -1;
      whys[i] = check_speed(opt, c, rng, notes[i], speed);
      // The gate holds the other cases to the large shape: wrong there, or too slow, and none counts.
      // (A student copy has no reference to time against, so its self-check has no gate.)
      if (c.gate_speed > 0 && !opt.reference_runner.empty()) {
        if (speed < 0)
          gate_failed = "not counted: the speed part's large shape did not pass (" + whys[i].substr(0, 200) +
                        "), and this exercise counts only when it does";
        else if (speed < c.gate_speed)
          gate_failed = "not counted: on the speed part's large shape this ran at " + fmt(speed) +
                        " of the reference solution's speed, below " + fmt(c.gate_speed) +
                        ", and this exercise counts only at that speed or more";
      }
    } else {
      const Reply r = ask(opt.limits, opt.runner, c.header, c.input, c.expect_values);
      whys[i] = judged(c, r);
      timed_out = r.timed_out;
    }
    if (c.is_step && !whys[i].empty()) steps_failed = true;
    if (!c.gates.empty() && !whys[i].empty() && gate_failed.empty()) gate_failed = "not counted: " + c.gates;
    if (c.gate_speed > 0 && !opt.reference_runner.empty() && timed_out && c.min_speed > 0 && gate_failed.empty())
      gate_failed =
          "not counted: the speed part's large shape did not run (an earlier case ran past the time "
          "limit), and this exercise counts only when it passes";
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string why = whys[i];
    if (c.needs_steps && steps_failed && why.empty())
      why = "not counted: the step from a drawn state failed, so this output is not the online update's";
    if (!gate_failed.empty() && why.empty()) why = gate_failed;
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
    if (a == "--list") {
      for (const ExerciseCases& e : exercise_registry()) std::printf("%s\n", e.id.c_str());
      return 0;
    }
    if (a == "--exercise") opt.exercise = value();
    else if (a == "--runner") opt.runner = value();
    else if (a == "--reference-runner") opt.reference_runner = value();
    else if (a == "--seed") opt.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--timeout") opt.limits.timeout_s = std::atof(value().c_str());
    else if (a == "--memory-mb") opt.limits.memory_mb = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--uid") opt.limits.uid = std::atoi(value().c_str());
    else if (a == "--reference-uid") opt.reference_uid = std::atoi(value().c_str());
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
  if (opt.exercise.empty() || opt.runner.empty() || opt.limits.timeout_s <= 0) {
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
