// Chapter 01 program: build/bin/ch01_naive_attention --help
#include "chapter_main.h"

int main(int argc, char** argv) {
  return fa::chapter_main(argc, argv, {1, "ch01_naive_attention", "Naive attention (fp32, S and P in device memory)"});
}
