// metrics: the exact exposition text of a small registry, escaping, cumulative histogram buckets,
// identity of registered children, validation, and increments racing from two threads.
#include "core/base/metrics.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace eldr {
namespace {

template <class T>
T* ok_or_die(result<T*> r) {
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.ok() ? *r : nullptr;
}

TEST(Metrics, RendersASmallRegistryExactly) {
  metric_registry reg;
  counter_metric* routed3 = ok_or_die(reg.counter(
      "eldr_route_decisions_total", "Routing decisions.", {{"worker", "3"}, {"model", "qwen"}}));
  counter_metric* routed0 = ok_or_die(reg.counter(
      "eldr_route_decisions_total", "Routing decisions.", {{"model", "qwen"}, {"worker", "0"}}));
  gauge_metric* epoch = ok_or_die(reg.gauge("eldr_centroid_epoch", "Current centroid epoch."));
  histogram_metric* lat = ok_or_die(
      reg.histogram("eldr_route_seconds", "Routing latency.", {0.25, 0.5, 1}, {{"m", "a"}}));
  ASSERT_NE(routed3, nullptr);
  ASSERT_NE(routed0, nullptr);
  ASSERT_NE(epoch, nullptr);
  ASSERT_NE(lat, nullptr);
  ASSERT_TRUE(
      reg.callback_gauge("eldr_cache_blocks", "Blocks cached.", {}, [] { return 42.0; }).ok());

  routed3->inc();
  routed3->inc(4);
  routed0->inc();
  epoch->set(7);
  lat->observe(0.125);
  lat->observe(0.25);  // le is inclusive
  lat->observe(0.75);
  lat->observe(3.0);

  const std::string want =
      "# HELP eldr_cache_blocks Blocks cached.\n"
      "# TYPE eldr_cache_blocks gauge\n"
      "eldr_cache_blocks 42\n"
      "# HELP eldr_centroid_epoch Current centroid epoch.\n"
      "# TYPE eldr_centroid_epoch gauge\n"
      "eldr_centroid_epoch 7\n"
      "# HELP eldr_route_decisions_total Routing decisions.\n"
      "# TYPE eldr_route_decisions_total counter\n"
      "eldr_route_decisions_total{model=\"qwen\",worker=\"0\"} 1\n"
      "eldr_route_decisions_total{model=\"qwen\",worker=\"3\"} 5\n"
      "# HELP eldr_route_seconds Routing latency.\n"
      "# TYPE eldr_route_seconds histogram\n"
      "eldr_route_seconds_bucket{m=\"a\",le=\"0.25\"} 2\n"
      "eldr_route_seconds_bucket{m=\"a\",le=\"0.5\"} 2\n"
      "eldr_route_seconds_bucket{m=\"a\",le=\"1\"} 3\n"
      "eldr_route_seconds_bucket{m=\"a\",le=\"+Inf\"} 4\n"
      "eldr_route_seconds_sum{m=\"a\"} 4.125\n"
      "eldr_route_seconds_count{m=\"a\"} 4\n";
  EXPECT_EQ(reg.render(), want);
}

TEST(Metrics, SameNameAndLabelsInAnyOrderIsTheSameObject) {
  metric_registry reg;
  auto* a = ok_or_die(reg.counter("x_total", "h", {{"a", "1"}, {"b", "2"}}));
  auto* b = ok_or_die(reg.counter("x_total", "h", {{"b", "2"}, {"a", "1"}}));
  auto* c = ok_or_die(reg.counter("x_total", "h", {{"a", "1"}, {"b", "3"}}));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  a->inc();
  EXPECT_EQ(b->value(), 1u);
  EXPECT_EQ(c->value(), 0u);
}

TEST(Metrics, EscapesLabelValuesAndHelp) {
  metric_registry reg;
  auto* g = ok_or_die(reg.gauge("g", "line1\nback\\slash \"q\"", {{"path", "a\\b\"c\nd"}}));
  ASSERT_NE(g, nullptr);
  g->set(-1.5);
  EXPECT_EQ(reg.render(),
            "# HELP g line1\\nback\\\\slash \"q\"\n"
            "# TYPE g gauge\n"
            "g{path=\"a\\\\b\\\"c\\nd\"} -1.5\n");
}

TEST(Metrics, HistogramBucketsAreCumulativeAndCountMatchesInf) {
  metric_registry reg;
  auto* h = ok_or_die(reg.histogram("h", "x", {1, 2, 4}));
  ASSERT_NE(h, nullptr);
  for (double v : {0.5, 1.5, 1.75, 3.0, 3.5, 3.75, 100.0})
    h->observe(v);
  EXPECT_EQ(h->bucket_count(0), 1u);
  EXPECT_EQ(h->bucket_count(1), 2u);
  EXPECT_EQ(h->bucket_count(2), 3u);
  EXPECT_EQ(h->bucket_count(3), 1u);
  EXPECT_EQ(h->count(), 7u);
  const std::string text = reg.render();
  EXPECT_NE(text.find("h_bucket{le=\"1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_bucket{le=\"2\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_bucket{le=\"4\"} 6\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_bucket{le=\"+Inf\"} 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_count 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_sum 114\n"), std::string::npos) << text;
}

TEST(Metrics, RefusesInvalidNamesLabelsAndConflicts) {
  metric_registry reg;
  for (const char* bad : {"", "1abc", "a-b", "a b", "é"})
    EXPECT_FALSE(reg.counter(bad, "h").ok()) << bad;
  for (const char* good : {"a", "_a", ":a", "a:b_c9", "A"})
    EXPECT_TRUE(reg.counter(good, "h").ok()) << good;

  EXPECT_FALSE(reg.counter("c", "h", {{"1x", "v"}}).ok());
  EXPECT_FALSE(reg.counter("c", "h", {{"a:b", "v"}}).ok());  // colons only in metric names
  EXPECT_FALSE(reg.counter("c", "h", {{"__x", "v"}}).ok());  // reserved
  EXPECT_FALSE(reg.counter("c", "h", {{"x", "1"}, {"x", "2"}}).ok());
  EXPECT_FALSE(reg.histogram("hh", "h", {1.0}, {{"le", "1"}}).ok());

  ASSERT_TRUE(reg.counter("dup", "help").ok());
  auto wrong_type = reg.gauge("dup", "help");
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_EQ(wrong_type.error().code(), status_code::invalid_argument);
  EXPECT_NE(wrong_type.error().message().find("counter"), std::string::npos);
  EXPECT_FALSE(reg.counter("dup", "other help").ok());

  EXPECT_FALSE(reg.histogram("h1", "h", {}).ok());
  EXPECT_FALSE(reg.histogram("h1", "h", {2.0, 1.0}).ok());
  EXPECT_FALSE(reg.histogram("h1", "h", {1.0, 1.0}).ok());
  EXPECT_FALSE(reg.histogram("h1", "h", {1.0, std::numeric_limits<double>::infinity()}).ok());
  ASSERT_TRUE(reg.histogram("h1", "h", {1.0, 2.0}).ok());
  EXPECT_FALSE(reg.histogram("h1", "h", {1.0, 3.0}, {{"a", "b"}}).ok());

  EXPECT_FALSE(reg.callback_gauge("cb", "h", {}, nullptr).ok());
  ASSERT_TRUE(reg.gauge("mixed", "h", {{"a", "1"}}).ok());
  EXPECT_FALSE(reg.callback_gauge("mixed", "h", {{"a", "1"}}, [] { return 1.0; }).ok());
  EXPECT_TRUE(reg.callback_gauge("mixed", "h", {{"a", "2"}}, [] { return 1.0; }).ok());
  EXPECT_FALSE(reg.gauge("mixed", "h", {{"a", "2"}}).ok());

  // Nothing that failed was registered.
  const std::string text = reg.render();
  EXPECT_EQ(text.find("1abc"), std::string::npos);
  EXPECT_EQ(text.find("\"1x\""), std::string::npos);
  EXPECT_EQ(text.find("# HELP c "), std::string::npos);
}

TEST(Metrics, CallbackGaugeIsReadAtRenderTime) {
  metric_registry reg;
  std::atomic<int> size{3};
  ASSERT_TRUE(reg.callback_gauge("cache_size", "h", {{"model", "m"}},
                                 [&size] { return static_cast<double>(size.load()); })
                  .ok());
  EXPECT_NE(reg.render().find("cache_size{model=\"m\"} 3\n"), std::string::npos);
  size = 9;
  EXPECT_NE(reg.render().find("cache_size{model=\"m\"} 9\n"), std::string::npos);
}

// A count owned elsewhere (the frontend's atomics) rendered as a counter, read by counter_value,
// kept apart from plain counters of the same labels, and gone once removed.
TEST(Metrics, CallbackCounterIsReadAtRenderTimeAndRemovable) {
  metric_registry reg;
  std::atomic<uint64_t> received{5};
  const auto read = [&received] { return static_cast<double>(received.load()); };
  ASSERT_TRUE(reg.callback_counter("received_total", "Read.", {{"channel", "route"}}, read).ok());
  EXPECT_NE(
      reg.render().find("# TYPE received_total counter\nreceived_total{channel=\"route\"} 5\n"),
      std::string::npos);
  received = 12;
  EXPECT_EQ(reg.counter_value("received_total", {{"channel", "route"}}), 12u);
  EXPECT_NE(reg.render().find("received_total{channel=\"route\"} 12\n"), std::string::npos);
  // The same labels cannot also be a plain counter, nor the family a gauge.
  EXPECT_FALSE(reg.counter("received_total", "Read.", {{"channel", "route"}}).ok());
  EXPECT_FALSE(reg.callback_gauge("received_total", "Read.", {{"channel", "x"}}, read).ok());
  EXPECT_FALSE(reg.callback_counter("received_total", "Read.", {{"channel", "x"}}, nullptr).ok());
  ok_or_die(reg.counter("plain_total", "P."))->inc();
  EXPECT_FALSE(reg.callback_counter("plain_total", "P.", {}, read).ok());
  EXPECT_TRUE(reg.remove("received_total", {{"channel", "route"}}));
  EXPECT_EQ(reg.render().find("received_total{"), std::string::npos);
  EXPECT_EQ(reg.counter_value("received_total", {{"channel", "route"}}), 0u);
}

TEST(Metrics, DeclaredFamilyShowsItsHeaderBeforeItsFirstChild) {
  metric_registry reg;
  ASSERT_TRUE(reg.declare("drops_total", "Drops, per cause.", metric_type::counter).ok());
  ASSERT_TRUE(reg.declare("held", "Held.", metric_type::gauge).ok());
  EXPECT_EQ(reg.render(),
            "# HELP drops_total Drops, per cause.\n# TYPE drops_total counter\n"
            "# HELP held Held.\n# TYPE held gauge\n");
  ok_or_die(reg.counter("drops_total", "Drops, per cause.", {{"cause", "full"}}))->inc(2);
  EXPECT_EQ(reg.render(),
            "# HELP drops_total Drops, per cause.\n# TYPE drops_total counter\n"
            "drops_total{cause=\"full\"} 2\n"
            "# HELP held Held.\n# TYPE held gauge\n");
  // Declaring is registering: the same rules, and a conflict either way is refused.
  EXPECT_TRUE(reg.declare("drops_total", "Drops, per cause.", metric_type::counter).ok());
  EXPECT_FALSE(reg.declare("drops_total", "Drops, per cause.", metric_type::gauge).ok());
  EXPECT_FALSE(reg.declare("held", "Other help.", metric_type::gauge).ok());
  EXPECT_FALSE(reg.counter("held", "Held.").ok());
  EXPECT_FALSE(reg.declare("1bad", "h", metric_type::counter).ok());
  EXPECT_FALSE(reg.declare("hist", "h", metric_type::histogram).ok());
  EXPECT_EQ(reg.render().find("hist"), std::string::npos);
}

TEST(Metrics, RemovedChildLeavesItsFamilyAndComesBackFromZero) {
  metric_registry reg;
  ok_or_die(reg.counter("msgs_total", "h", {{"publisher", "a"}, {"model", "m"}}))->inc(5);
  ok_or_die(reg.counter("msgs_total", "h", {{"model", "m"}, {"publisher", "b"}}))->inc(7);
  // Labels in another order name the same child.
  EXPECT_TRUE(reg.remove("msgs_total", {{"model", "m"}, {"publisher", "a"}}));
  EXPECT_FALSE(reg.remove("msgs_total", {{"model", "m"}, {"publisher", "a"}}));
  EXPECT_FALSE(reg.remove("no_such_total", {}));
  EXPECT_EQ(reg.render(),
            "# HELP msgs_total h\n# TYPE msgs_total counter\n"
            "msgs_total{model=\"m\",publisher=\"b\"} 7\n");
  EXPECT_EQ(reg.counter_value("msgs_total", {{"publisher", "a"}, {"model", "m"}}), 0u);
  EXPECT_EQ(
      ok_or_die(reg.counter("msgs_total", "h", {{"model", "m"}, {"publisher", "a"}}))->value(), 0u);
  EXPECT_TRUE(reg.remove("msgs_total", {{"model", "m"}, {"publisher", "b"}}));
  EXPECT_TRUE(reg.remove("msgs_total", {{"model", "m"}, {"publisher", "a"}}));
  EXPECT_EQ(reg.render(), "# HELP msgs_total h\n# TYPE msgs_total counter\n");
}

TEST(Metrics, CounterValueReadsTheChildByLabelsAndZeroWhenAbsent) {
  metric_registry reg;
  ok_or_die(reg.counter("f_total", "h", {{"model", "m"}, {"reason", "x"}}))->inc(3);
  EXPECT_EQ(reg.counter_value("f_total", {{"reason", "x"}, {"model", "m"}}), 3u);
  EXPECT_EQ(reg.counter_value("f_total", {{"reason", "y"}, {"model", "m"}}), 0u);
  EXPECT_EQ(reg.counter_value("g_total", {}), 0u);
  ok_or_die(reg.gauge("g", "h"))->set(4);
  EXPECT_EQ(reg.counter_value("g", {}), 0u);  // a gauge is not a counter
}

TEST(Metrics, AdvanceToMovesACounterUpOnly) {
  counter_metric c;
  c.advance_to(5);
  EXPECT_EQ(c.value(), 5u);
  c.advance_to(3);  // an older copy of the owner's count
  EXPECT_EQ(c.value(), 5u);
  c.inc();
  c.advance_to(9);
  EXPECT_EQ(c.value(), 9u);
}

TEST(Metrics, FormatsSpecialValues) {
  EXPECT_EQ(format_metric_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_metric_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_metric_value(std::nan("")), "NaN");
  EXPECT_EQ(format_metric_value(0.1), "0.1");
  EXPECT_EQ(format_metric_value(12345), "12345");
}

TEST(Metrics, ConcurrentIncrementsFromTwoThreadsSumExactly) {
  metric_registry reg;
  auto* c = ok_or_die(reg.counter("c_total", "h"));
  auto* g = ok_or_die(reg.gauge("g", "h"));
  auto* h = ok_or_die(reg.histogram("h", "h", {0.5}));
  ASSERT_NE(c, nullptr);
  ASSERT_NE(g, nullptr);
  ASSERT_NE(h, nullptr);
  constexpr int per_thread = 200000;
  auto work = [&] {
    for (int i = 0; i < per_thread; ++i) {
      c->inc();
      g->add(1);
      h->observe(1.0);
    }
  };
  std::thread t1(work);
  std::thread t2(work);
  // Rendering while they run must be safe too (and is what TSan runs would check).
  for (int i = 0; i < 10; ++i)
    EXPECT_FALSE(reg.render().empty());
  t1.join();
  t2.join();
  EXPECT_EQ(c->value(), 2u * per_thread);
  EXPECT_EQ(g->value(), 2.0 * per_thread);
  EXPECT_EQ(h->count(), 2u * per_thread);
  EXPECT_EQ(h->bucket_count(1), 2u * per_thread);
  EXPECT_EQ(h->sum(), 2.0 * per_thread);
}

TEST(Metrics, ConcurrentRegistrationReturnsOneObject) {
  metric_registry reg;
  counter_metric* seen[2] = {nullptr, nullptr};
  auto work = [&](int t) {
    for (int i = 0; i < 1000; ++i) {
      auto r = reg.counter("race_total", "h", {{"w", std::to_string(i % 7)}});
      if (r.ok() && i == 0) seen[t] = *r;
      if (r.ok()) (*r)->inc();
    }
  };
  std::thread t1(work, 0);
  std::thread t2(work, 1);
  t1.join();
  t2.join();
  ASSERT_NE(seen[0], nullptr);
  EXPECT_EQ(seen[0], seen[1]);
  uint64_t total = 0;
  for (int w = 0; w < 7; ++w)
    total += (*reg.counter("race_total", "h", {{"w", std::to_string(w)}}))->value();
  EXPECT_EQ(total, 2000u);
}

}  // namespace
}  // namespace eldr
