// Chapter 03 program: build/bin/ch03_online_softmax --help
#include "chapter_main.h"

int main(int argc, char** argv) {
  return fa::chapter_main(argc, argv,
                          {3, "ch03_online_softmax", "Online softmax (fp32, one pass for max and sum; fused)"});
}
