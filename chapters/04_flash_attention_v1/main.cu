// Chapter 04 program: build/bin/ch04_flash_attention_v1 --help
#include "chapter_main.h"

int main(int argc, char** argv) {
  return fa::chapter_main(
      argc, argv, {4, "ch04_flash_attention_v1", "FlashAttention-1 (fp32, tiled and fused, online softmax per tile)"});
}
