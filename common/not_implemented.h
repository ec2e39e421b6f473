// The stub a handout puts where a solution was (tools/handout.py): it compiles, and at run time
// it throws, so the exercise's tests fail with "not implemented: <what to write>".
#pragma once

#include <stdexcept>
#include <string>

#define FA_NOT_IMPLEMENTED(what) throw std::logic_error(std::string("not implemented: ") + (what))
