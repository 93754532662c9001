// SPDX-License-Identifier: Apache-2.0
// The progress line and the small formatting helpers.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cli.h"

namespace maxsim::cli {
namespace {

std::atomic<bool> g_disabled{false};
std::atomic<bool> g_forced{false};

}  // namespace

void Progress::Disable() { g_disabled = true; }
void Progress::Force() { g_forced = true; }

bool Progress::Enabled() {
  if (g_disabled) return false;
  if (g_forced) return true;
  if (const char* e = std::getenv("MAXSIM_NO_PROGRESS"); e && e[0] && e[0] != '0') return false;
  return isatty(STDERR_FILENO) == 1;
}

Progress::Progress(std::string label, uint64_t total, const char* unit)
    : label_(std::move(label)), total_(total), unit_(unit), start_(std::chrono::steady_clock::now()) {
  active_ = Enabled();
  lines_ = active_ && isatty(STDERR_FILENO) != 1;
  if (active_) thread_ = std::thread([this] { Loop(); });
}

Progress::~Progress() {
  if (!active_) return;
  stop_ = true;
  thread_.join();
  if (lines_) {
    std::fprintf(stderr, "%s (done)\n", Line().c_str());
  } else {
    std::fprintf(stderr, "\r\033[K");
  }
  std::fflush(stderr);
}

void Progress::Stage(const std::string& label) {
  std::lock_guard<std::mutex> lock(mu_);
  label_ = label;
}

void Progress::Loop() {
  // The first frame waits a little, so that short work never flickers a line.
  int waited = 0;
  const int every = lines_ ? 20 : 2;  // ticks of 50 ms: a line a second in a log, a redraw every 100 ms
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (++waited % every == 0 && waited >= 4) Draw();
  }
}

void Progress::Draw() {
  const std::string line = Line();
  std::fprintf(stderr, lines_ ? "%s\n" : "\r\033[K%s", line.c_str());
  std::fflush(stderr);
}

std::string Progress::Line() {
  std::string label;
  {
    std::lock_guard<std::mutex> lock(mu_);
    label = label_;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char line[256];
  if (total_ == 0) {
    static const char kSpin[] = "|/-\\";
    if (lines_) {
      std::snprintf(line, sizeof(line), "%s  %.1f s", label.c_str(), elapsed);
    } else {
      std::snprintf(line, sizeof(line), "%c %s  %.1f s", kSpin[static_cast<int>(elapsed * 10) % 4], label.c_str(),
                    elapsed);
    }
  } else {
    const uint64_t done = std::min<uint64_t>(done_.load(std::memory_order_relaxed), total_);
    const double frac = static_cast<double>(done) / static_cast<double>(total_);
    char bar[31];
    const int fill = static_cast<int>(frac * 30);
    for (int i = 0; i < 30; ++i) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    const double rate = elapsed > 0 ? done / elapsed : 0;
    char eta[32] = "?";
    if (done >= total_) {
      std::snprintf(eta, sizeof(eta), "%.1f s", elapsed);  // finished: how long it took
    } else if (rate > 0) {
      const double left = (total_ - done) / rate;
      if (left < 1) std::snprintf(eta, sizeof(eta), "<1 s");
      else std::snprintf(eta, sizeof(eta), "%.0f s", left);
    }
    std::snprintf(line, sizeof(line), "%s [%s] %3.0f%%  %s/%s %s  %s %s/s  %s %s", label.c_str(), bar, frac * 100,
                  HumanCount(static_cast<double>(done)).c_str(), HumanCount(static_cast<double>(total_)).c_str(),
                  unit_, HumanCount(rate).c_str(), unit_, done >= total_ ? "in" : "eta", eta);
  }
  return line;
}

std::string HumanCount(double v) {
  char b[32];
  const double a = std::fabs(v);
  if (a >= 1e12) std::snprintf(b, sizeof(b), "%.2fT", v / 1e12);
  else if (a >= 1e9) std::snprintf(b, sizeof(b), "%.2fG", v / 1e9);
  else if (a >= 1e6) std::snprintf(b, sizeof(b), "%.2fM", v / 1e6);
  else if (a >= 1e4) std::snprintf(b, sizeof(b), "%.1fK", v / 1e3);
  else std::snprintf(b, sizeof(b), "%.0f", v);
  return b;
}

std::string HumanSeconds(double s) {
  char b[32];
  if (s < 1e-3) std::snprintf(b, sizeof(b), "%.1f us", s * 1e6);
  else if (s < 1) std::snprintf(b, sizeof(b), "%.2f ms", s * 1e3);
  else if (s < 120) std::snprintf(b, sizeof(b), "%.2f s", s);
  else std::snprintf(b, sizeof(b), "%.0f min", s / 60);
  return b;
}

std::string HumanBytes(double bytes) {
  char b[32];
  if (bytes >= 1e9) std::snprintf(b, sizeof(b), "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(b, sizeof(b), "%.1f MB", bytes / 1e6);
  else if (bytes >= 1e3) std::snprintf(b, sizeof(b), "%.1f KB", bytes / 1e3);
  else std::snprintf(b, sizeof(b), "%.0f B", bytes);
  return b;
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          o += b;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o;
}

std::string FloatText(float v) {
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char b[32];
  std::snprintf(b, sizeof(b), "%.9g", static_cast<double>(v));
  return b;
}

}  // namespace maxsim::cli
