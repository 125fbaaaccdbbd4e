// `image`: a batch image pipeline, one image per step: resize (bilinear) to
// args.out_width × args.out_height, box blur of args.blur_radius, and a watermark (a blended
// checker mark in the lower-right corner). Inputs are PPM (P6) files from args.input_dir, or
// procedurally generated args.width × args.height images; args.count > 0 ends the task after
// that many images; args.write_every > 0 writes every n-th result to results_dir as PPM.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "core/files.h"
#include "freeride/side_task.h"

namespace freeride {
namespace {

struct Image {
  int64_t w = 0, h = 0;
  std::vector<float> rgb;  // [h, w, 3] in [0, 1]
};

absl::StatusOr<Image> ReadPpm(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string magic;
  int64_t w = 0, h = 0, max = 0;
  if (!(in >> magic >> w >> h >> max) || magic != "P6" || w <= 0 || h <= 0 || max != 255) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a binary PPM (P6, 8-bit) image", path));
  }
  in.get();
  std::vector<unsigned char> bytes(w * h * 3);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()))) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: truncated pixel data", path));
  }
  Image img{w, h, std::vector<float>(bytes.size())};
  for (size_t i = 0; i < bytes.size(); ++i) img.rgb[i] = bytes[i] / 255.0f;
  return img;
}

std::string ToPpm(const float* rgb, int64_t w, int64_t h) {
  std::string out = absl::StrFormat("P6\n%d %d\n255\n", w, h);
  for (int64_t i = 0; i < w * h * 3; ++i) {
    out.push_back(static_cast<char>(std::lround(std::clamp(rgb[i], 0.0f, 1.0f) * 255)));
  }
  return out;
}

class ImageTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    ArgReader args(ctx.name, *ctx.args);
    if (absl::Status s = args.OnlyKnown({"input_dir", "width", "height", "out_width",
                                         "out_height", "blur_radius", "count", "write_every"});
        !s.ok()) {
      return s;
    }
    auto dir = args.String("input_dir", "");
    auto w = args.Int("width", 512, 1, 1 << 15), h = args.Int("height", 512, 1, 1 << 15);
    auto ow = args.Int("out_width", 256, 1, 1 << 15), oh = args.Int("out_height", 256, 1, 1 << 15);
    auto radius = args.Int("blur_radius", 2, 0, 64);
    auto count = args.Int("count", 0, 0, int64_t{1} << 40);
    auto write_every = args.Int("write_every", 0, 0, int64_t{1} << 40);
    for (const absl::Status& s : {dir.status(), w.status(), h.status(), ow.status(), oh.status(),
                                  radius.status(), count.status(), write_every.status()}) {
      if (!s.ok()) return s;
    }
    width_ = *w, height_ = *h, out_w_ = *ow, out_h_ = *oh, radius_ = *radius;
    count_ = *count, write_every_ = *write_every;
    first_ = ctx.restarts * count_;  // a restart (repeat) takes the next `count` images
    if (!dir->empty()) {
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(*dir, ec)) {
        if (entry.path().extension() == ".ppm") inputs_.push_back(entry.path().string());
      }
      std::sort(inputs_.begin(), inputs_.end());
      if (inputs_.empty()) {
        return absl::NotFoundError(absl::StrFormat("args.input_dir: no .ppm files in %s", *dir));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Load(SideTaskContext& ctx) override {
    const int64_t in_pixels = inputs_.empty() ? width_ * height_ : 0;
    for (auto [ptr, n] : {std::pair{&src_, in_pixels * 3}, std::pair{&resized_, out_w_ * out_h_ * 3},
                          std::pair{&tmp_, out_w_ * out_h_ * 3}}) {
      if (n == 0) continue;
      absl::StatusOr<float*> p = ctx.arena->AllocateArray<float>(n, "image buffers");
      if (!p.ok()) return p.status();
      *ptr = *p;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<double> Step(SideTaskContext& ctx) override {
    Image loaded;
    const float* src = src_;
    int64_t w = width_, h = height_;
    if (!inputs_.empty()) {
      absl::StatusOr<Image> img = ReadPpm(inputs_[(first_ + done_) % inputs_.size()]);
      if (!img.ok()) return img.status();
      loaded = *std::move(img);
      src = loaded.rgb.data(), w = loaded.w, h = loaded.h;
    } else {
      Generate(first_ + done_);
    }
    Resize(src, w, h);
    Blur();
    Watermark();
    ++done_;
    if (write_every_ > 0 && (first_ + done_) % write_every_ == 0) {
      absl::Status s = WriteFileAtomically(
          absl::StrFormat("%s/image_%06d.ppm", ctx.results_dir, first_ + done_),
          ToPpm(resized_, out_w_, out_h_));
      if (!s.ok()) return s;
    }
    return 1.0;
  }

  bool Done() const override { return count_ > 0 && done_ >= count_; }
  double TotalUnits() const override { return static_cast<double>(count_); }
  std::string UnitName() const override { return "images"; }
  std::string Summary() const override {
    return absl::StrFormat("%d images %dx%d -> %dx%d", done_, width_, height_, out_w_, out_h_);
  }

 private:
  void Generate(int64_t seed) {
    for (int64_t y = 0; y < height_; ++y) {
      for (int64_t x = 0; x < width_; ++x) {
        float* p = src_ + (y * width_ + x) * 3;
        p[0] = 0.5f + 0.5f * std::sin(0.02f * x + 0.1f * seed);
        p[1] = 0.5f + 0.5f * std::cos(0.03f * y - 0.07f * seed);
        p[2] = ((x / 32 + y / 32 + seed) % 2) ? 0.8f : 0.2f;
      }
    }
  }
  void Resize(const float* src, int64_t w, int64_t h) {
    for (int64_t y = 0; y < out_h_; ++y) {
      const float fy = std::max(0.0f, (y + 0.5f) * h / out_h_ - 0.5f);
      const int64_t y0 = std::min<int64_t>(h - 1, static_cast<int64_t>(fy));
      const int64_t y1 = std::min(h - 1, y0 + 1);
      const float ty = fy - y0;
      for (int64_t x = 0; x < out_w_; ++x) {
        const float fx = std::max(0.0f, (x + 0.5f) * w / out_w_ - 0.5f);
        const int64_t x0 = std::min<int64_t>(w - 1, static_cast<int64_t>(fx));
        const int64_t x1 = std::min(w - 1, x0 + 1);
        const float tx = fx - x0;
        for (int c = 0; c < 3; ++c) {
          const float a = src[(y0 * w + x0) * 3 + c] * (1 - tx) + src[(y0 * w + x1) * 3 + c] * tx;
          const float b = src[(y1 * w + x0) * 3 + c] * (1 - tx) + src[(y1 * w + x1) * 3 + c] * tx;
          resized_[(y * out_w_ + x) * 3 + c] = a * (1 - ty) + b * ty;
        }
      }
    }
  }
  // Separable box blur, clamped at the edges.
  void Blur() {
    if (radius_ == 0) return;
    const float norm = 1.0f / (2 * radius_ + 1);
    for (int pass = 0; pass < 2; ++pass) {
      const float* in = pass == 0 ? resized_ : tmp_;
      float* out = pass == 0 ? tmp_ : resized_;
      for (int64_t y = 0; y < out_h_; ++y) {
        for (int64_t x = 0; x < out_w_; ++x) {
          for (int c = 0; c < 3; ++c) {
            float sum = 0;
            for (int64_t k = -radius_; k <= radius_; ++k) {
              const int64_t xx = pass == 0 ? std::clamp<int64_t>(x + k, 0, out_w_ - 1) : x;
              const int64_t yy = pass == 1 ? std::clamp<int64_t>(y + k, 0, out_h_ - 1) : y;
              sum += in[(yy * out_w_ + xx) * 3 + c];
            }
            out[(y * out_w_ + x) * 3 + c] = sum * norm;
          }
        }
      }
    }
  }
  void Watermark() {
    const int64_t size = std::min<int64_t>(32, std::min(out_w_, out_h_));
    for (int64_t y = out_h_ - size; y < out_h_; ++y) {
      for (int64_t x = out_w_ - size; x < out_w_; ++x) {
        const float mark = ((x / 4 + y / 4) % 2) ? 1.0f : 0.0f;
        for (int c = 0; c < 3; ++c) {
          float& p = resized_[(y * out_w_ + x) * 3 + c];
          p = 0.7f * p + 0.3f * mark;
        }
      }
    }
  }

  int64_t width_ = 512, height_ = 512, out_w_ = 256, out_h_ = 256, radius_ = 2;
  int64_t count_ = 0, write_every_ = 0, done_ = 0, first_ = 0;
  std::vector<std::string> inputs_;
  float *src_ = nullptr, *resized_ = nullptr, *tmp_ = nullptr;
};

}  // namespace

FREERIDE_REGISTER_SIDE_TASK(ImageTask, "image");

}  // namespace freeride
