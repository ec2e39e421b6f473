// Chapter 05 program: build/bin/ch05_flash_attention_v2 --help
#include "chapter_main.h"

int main(int argc, char** argv) {
  return fa::chapter_main(argc, argv,
                          {5, "ch05_flash_attention_v2", "FlashAttention-2 (fp16/bf16 in and out, fp32 inside)"});
}
