// Chapter 02 program: build/bin/ch02_safe_softmax --help
#include "chapter_main.h"

int main(int argc, char** argv) {
  return fa::chapter_main(argc, argv, {2, "ch02_safe_softmax", "Safe softmax (fp32, max subtracted, three passes)"});
}
