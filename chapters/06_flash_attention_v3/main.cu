// Chapter 06 program: build/bin/ch06_flash_attention_v3 --help
#include "chapter_main.h"

int main(int argc, char** argv) {
  return fa::chapter_main(argc, argv, {6, "ch06_flash_attention_v3", "FlashAttention-3 on Hopper (bf16; sm_90 only)"});
}
