// Chapter 09 program: build/bin/ch09_real_model_features --help
#include "chapter_main.h"

int main(int argc, char** argv) {
  return fa::chapter_main(
      argc, argv,
      {9, "ch09_real_model_features", "what real models need: packed batches, windows, softcap, ALiBi, bias", true});
}
