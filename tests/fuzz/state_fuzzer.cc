// libFuzzer target over durable-state recovery. data[0] % 4 picks what the
// rest becomes in a fresh state directory: a log segment (0), a snapshot
// (1), the MANIFEST's text with a correct checksum line appended (2, so that
// the parser gets past the checksum) or the MANIFEST as it is (3).
// DurableState::Open must answer with a status — recovered, a torn tail
// dropped, or DATA_LOSS — never crash, hang or over-allocate. When it
// recovers, the state must survive its own round trip: Close writes a
// snapshot, and a second Open of the directory recovers the same models,
// byte for byte in the snapshot encoding; anything else aborts.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_format.h"
#include "server/core/model_store.h"
#include "server/state/codec.h"
#include "server/state/durable_state.h"

namespace {

// Every model of `store` in the snapshot encoding, in name order.
std::string Fingerprint(const normd::ModelStore& store) {
  std::string bytes;
  normd::state::ByteWriter out(bytes);
  for (const normd::BatchNormModel& model : store.List(/*with_arrays=*/true)) {
    normd::state::EncodeModel(model, out);
  }
  return bytes;
}

void Fail(const char* what) {
  std::fprintf(stderr, "state_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("normd_state_fuzz_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string name, contents = body;
  switch (data[0] % 4) {
    case 0:
      name = normd::state::SegmentFileName(1);
      break;
    case 1: {
      // A snapshot is named by the sequence number it holds (after the
      // 8-byte magic and 4-byte version), so that recovery gets past the
      // name check.
      uint64_t sequence = 0;
      if (size >= 1 + 20) {
        for (int i = 7; i >= 0; --i) {
          sequence = (sequence << 8) | data[1 + 12 + i];
        }
      }
      name = normd::state::SnapshotFileName(sequence);
      break;
    }
    case 2:
      name = "MANIFEST";
      contents += absl::StrFormat("crc32 %08x\n", normd::state::Crc32(body));
      break;
    default:
      name = "MANIFEST";
      break;
  }
  {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  }
  {
    normd::ModelStore store;
    normd::state::RecoveryReport report;
    auto state =
        normd::state::DurableState::Open({dir, 1 << 20}, store, &report);
    if (state.ok()) {
      const std::string recovered = Fingerprint(store);
      if (!(*state)->Close().ok()) Fail("Close of a recovered state failed");
      state->reset();
      normd::ModelStore again;
      normd::state::RecoveryReport second;
      auto reopened =
          normd::state::DurableState::Open({dir, 1 << 20}, again, &second);
      if (!reopened.ok()) Fail("a recovered state did not reopen");
      if (Fingerprint(again) != recovered) {
        Fail("a recovered state reopened with other models");
      }
    }
  }
  // The decoders on their own, too.
  normd::state::MutationRecord record;
  (void)normd::state::DecodeMutation(body, &record);
  return 0;
}
