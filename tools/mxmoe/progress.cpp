// Progress of a long `mxmoe run` on a terminal: one line per phase on stderr, redrawn every second
// with the time spent and, where the phase has an estimate, about how long is left. Quiet when
// stderr is not a terminal (logs and pipes get the report only).
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {
namespace {

using Clock = std::chrono::steady_clock;

class Ticker {
 public:
  Ticker() : enabled_(::isatty(STDERR_FILENO) == 1) {}
  ~Ticker() {
    {
      std::lock_guard<std::mutex> lock(m_);
      finish_line();
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool enabled() const { return enabled_; }
  void end() {
    std::lock_guard<std::mutex> lock(m_);
    finish_line();
  }

  void begin(const std::string& phase, double estimate_s) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(m_);
    finish_line();
    phase_ = phase;
    estimate_ = estimate_s;
    start_ = Clock::now();
    active_ = true;
    draw();
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(m_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::seconds(1));
      if (active_ && !stop_) draw();
    }
  }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // "\r" + clear to the end of the line: the phase's line is rewritten in place.
  void draw() {
    const double t = elapsed();
    std::string text = "mxmoe: " + phase_;
    if (t >= 1) text += ": " + std::to_string(static_cast<long long>(t)) + " s";
    // The time left while there is at least half a second of it; past the estimate, that it ran
    // longer (a phase estimated under half a second shows only its time).
    const double left = estimate_ - t;
    if (estimate_ > 0 && left >= 0.5)
      text += (t >= 1 ? ", about " : ": about ") + seconds(left) + " left";
    else if (estimate_ > 0 && left < 0)
      text += std::string(t >= 1 ? ", " : ": ") + "longer than the estimate of " + seconds(estimate_);
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
  }
  void finish_line() {
    if (!active_) return;
    std::fprintf(stderr, "\r\033[Kmxmoe: %s: %s\n", phase_.c_str(), seconds(elapsed()).c_str());
    active_ = false;
  }
  static std::string seconds(double s) {
    if (s < 10) return std::to_string(static_cast<int>(s * 10 + 0.5) / 10) + "." +
                       std::to_string(static_cast<int>(s * 10 + 0.5) % 10) + " s";
    if (s < 120) return std::to_string(static_cast<long long>(s + 0.5)) + " s";
    return std::to_string(static_cast<long long>(s / 60 + 0.5)) + " min";
  }

  const bool enabled_;
  std::mutex m_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false, active_ = false;
  std::string phase_;
  double estimate_ = 0;
  Clock::time_point start_;
};

Ticker& ticker() {
  static Ticker t;
  return t;
}

}  // namespace

bool progress_shown() { return ticker().enabled(); }
void progress(const std::string& phase, double estimate_s) { ticker().begin(phase, estimate_s); }
void progress_end() { ticker().end(); }

}  // namespace mxmoe::cli
