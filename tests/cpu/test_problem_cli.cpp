// validate() and the command line on good and bad input: each bad input gives one clear
// message naming the value and what is allowed.
#include <gtest/gtest.h>

#include <vector>

#include "cli.h"
#include "problem.h"

namespace fa {
namespace {

std::string validate_error(AttentionShape s) {
  try {
    s.validate();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Validate, AcceptsGoodShapes) {
  AttentionShape s;
  EXPECT_EQ(validate_error(s), "");
  s.heads_q = 32;
  s.heads_kv = 8;
  s.seq_q = 1;
  s.seq_kv = 16384;
  EXPECT_EQ(validate_error(s), "");
}

TEST(Validate, NamesTheBadValue) {
  AttentionShape s;
  s.head_dim = 0;
  EXPECT_EQ(validate_error(s), "head_dim must be between 1 and 1024, got 0");
  s = AttentionShape{};
  s.seq_q = -3;
  EXPECT_EQ(validate_error(s), "seq_q must be between 1 and 4194304, got -3");
  s = AttentionShape{};
  s.heads_q = 6;
  s.heads_kv = 4;
  EXPECT_EQ(validate_error(s), "heads_q (6) must be a multiple of heads_kv (4)");
  s = AttentionShape{};
  s.scale = -1;
  EXPECT_EQ(validate_error(s), "scale must be a finite number > 0 (or 0 for 1/sqrt(head_dim)), got -1");
}

TEST(Shape, CausalIsBottomRightAligned) {
  AttentionShape s;
  s.causal = true;
  s.seq_q = 3;
  s.seq_kv = 5;
  EXPECT_EQ(s.visible_keys(0), 3);
  EXPECT_EQ(s.visible_keys(2), 5);
  s.seq_q = 5;
  s.seq_kv = 3;
  EXPECT_EQ(s.visible_keys(0), 0);
  EXPECT_EQ(s.visible_keys(1), 0);
  EXPECT_EQ(s.visible_keys(2), 1);
  EXPECT_EQ(s.visible_keys(4), 3);
  EXPECT_TRUE(s.visible(4, 2));
  EXPECT_FALSE(s.visible(3, 2));
}

TEST(Shape, OffsetsAndFlops) {
  AttentionShape s;
  s.batch = 2;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.seq_q = 3;
  s.seq_kv = 5;
  s.head_dim = 8;
  EXPECT_EQ(s.q_head_offset(5), 5 * 3 * 8);
  // bh 5 = batch 1, head 1 -> kv head 0 of batch 1 = flat kv head 2.
  EXPECT_EQ(s.kv_head_offset(5), 2 * 5 * 8);
  EXPECT_EQ(s.kv_head_offset(7), 3 * 5 * 8);
  EXPECT_DOUBLE_EQ(s.forward_flops(), 4.0 * 2 * 4 * 3 * 5 * 8);
  s.causal = true;
  EXPECT_DOUBLE_EQ(s.forward_flops(), 2.0 * 2 * 4 * 3 * 5 * 8);
}

CliOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  return parse_cli(int(args.size()), args.data());
}

std::string parse_error(std::vector<const char*> args) {
  try {
    parse(args);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Cli, DefaultsAndFollowers) {
  CliOptions o = parse({});
  EXPECT_EQ(o.shape.batch, default_gpu_shape().batch);
  EXPECT_FALSE(o.shape_given);
  EXPECT_EQ(o.variant, "all");
  o = parse({"--heads", "8", "--seq-q", "100"});
  EXPECT_EQ(o.shape.heads_kv, 8);  // follows --heads
  EXPECT_EQ(o.shape.seq_kv, 100);  // follows --seq-q
  EXPECT_TRUE(o.shape_given);
  o = parse({"--heads=8", "--heads-kv=2", "--seq", "64", "--seq-kv", "10", "--causal", "--dim=32", "--variant", "2",
             "--iters", "0", "--seed", "7", "--no-check"});
  EXPECT_EQ(o.shape.heads_q, 8);
  EXPECT_EQ(o.shape.heads_kv, 2);
  EXPECT_EQ(o.shape.seq_q, 64);
  EXPECT_EQ(o.shape.seq_kv, 10);
  EXPECT_EQ(o.shape.head_dim, 32);
  EXPECT_TRUE(o.shape.causal);
  EXPECT_EQ(o.variant, "2");
  EXPECT_EQ(o.iters, 0);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_FALSE(o.check);
}

TEST(Cli, LogitScaleMultipliesTheDefaultScale) {
  CliOptions o = parse({"--logit-scale", "4", "--dim", "64"});
  EXPECT_DOUBLE_EQ(o.shape.softmax_scale(), 4.0 / 8.0);
}

TEST(Cli, BadInputGivesOneClearMessage) {
  EXPECT_EQ(parse_error({"--dim", "0"}), "--dim expects a positive integer, got '0'");
  EXPECT_EQ(parse_error({"--seq-q", "-3"}), "--seq-q expects a positive integer, got '-3'");
  EXPECT_EQ(parse_error({"--batch", "two"}), "--batch expects a positive integer, got 'two'");
  EXPECT_EQ(parse_error({"--batch", "99999999999"}), "--batch expects a positive integer, got '99999999999'");
  EXPECT_EQ(parse_error({"--dim"}), "--dim needs a value");
  EXPECT_EQ(parse_error({"--iters", "-1"}), "--iters expects an integer >= 0, got '-1'");
  EXPECT_EQ(parse_error({"--seed", "-1"}), "--seed expects an integer >= 0, got '-1'");
  EXPECT_EQ(parse_error({"--logit-scale", "0"}), "--logit-scale expects a finite number > 0, got '0'");
  EXPECT_EQ(parse_error({"--logit-scale", "nan"}), "--logit-scale expects a finite number > 0, got 'nan'");
  EXPECT_EQ(parse_error({"--causal=1"}), "--causal takes no value, got '1'");
  EXPECT_EQ(parse_error({"--frobnicate"}), "unknown argument '--frobnicate' (see --help)");
  EXPECT_EQ(parse_error({"extra"}), "unknown argument 'extra' (see --help)");
}

}  // namespace
}  // namespace fa
