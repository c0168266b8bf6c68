// mmfeed-bench-decode: the bare libjpeg-turbo baseline. Decodes every file given (full size,
// RGB, TurboJPEG) `--repeat` times on `--threads` threads and prints images/s as JSON.
//   mmfeed-bench-decode [--threads N] [--repeat K] FILE...
#include <turbojpeg.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int threads = 2, repeat = 1;
  std::vector<std::string> data;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc)
      threads = std::stoi(argv[++i]);
    else if (a == "--repeat" && i + 1 < argc)
      repeat = std::stoi(argv[++i]);
    else {
      std::ifstream f(a, std::ios::binary);
      data.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
  }
  std::atomic<size_t> next{0};
  std::atomic<long> done{0};
  size_t total = data.size() * repeat;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      tjhandle h = tjInitDecompress();
      std::vector<unsigned char> out;
      for (size_t i; (i = next++) < total;) {
        const std::string& d = data[i % data.size()];
        int w, h2, ss, cs;
        auto* src = reinterpret_cast<const unsigned char*>(d.data());
        if (tjDecompressHeader3(h, src, d.size(), &w, &h2, &ss, &cs) != 0) continue;
        out.resize(static_cast<size_t>(w) * h2 * 3);
        if (tjDecompress2(h, src, d.size(), out.data(), w, 0, h2, TJPF_RGB, TJFLAG_ACCURATEDCT) ==
            0)
          ++done;
      }
      tjDestroy(h);
    });
  for (auto& t : pool) t.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"images\": %ld, \"seconds\": %.4f, \"images_per_s\": %.1f}\n", done.load(), s,
              done.load() / s);
  return 0;
}
