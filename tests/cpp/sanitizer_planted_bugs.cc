// Deliberate bugs for the sanitizer build (ATTN2D_SANITIZE): ctest passes only when
// AddressSanitizer reports the heap overflow and UBSan the signed overflow, so a clean sanitized
// run of the suite means the instrumentation was in place. Built only with the option: a plain
// build would read past the buffer silently.
#include <climits>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

// Volatile sizes, so that the compiler cannot prove the bugs and fold them away.
int heap_overflow() {
  volatile int n = 16;
  std::vector<float> buffer(static_cast<size_t>(n), 1.0f);
  const float* data = buffer.data();
  return static_cast<int>(data[n]);  // one element past the allocation
}

int signed_overflow() {
  volatile int big = INT_MAX;
  volatile int one = 1;
  return big + one;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s heap-overflow|signed-overflow\n", argv[0]);
    return 2;
  }
  int result;
  if (std::strcmp(argv[1], "heap-overflow") == 0) {
    result = heap_overflow();
  } else if (std::strcmp(argv[1], "signed-overflow") == 0) {
    result = signed_overflow();
  } else {
    std::fprintf(stderr, "unknown bug %s\n", argv[1]);
    return 2;
  }
  std::printf("planted bug survived: %d\n", result);
  return 0;
}
