// libFuzzer target over durable-state recovery: the bytes become a log
// segment (first byte even) or a snapshot (odd) in a fresh state directory,
// and DurableState::Open must answer with a status — recovered, a torn tail
// dropped, or DATA_LOSS — never crash, hang or over-allocate.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "server/core/model_store.h"
#include "server/state/codec.h"
#include "server/state/durable_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("normd_state_fuzz_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // A snapshot is named by the sequence number it holds (after the 8-byte
  // magic and 4-byte version), so that recovery gets past the name check.
  uint64_t sequence = 0;
  if (size >= 1 + 20) {
    for (int i = 7; i >= 0; --i) sequence = (sequence << 8) | data[1 + 12 + i];
  }
  const std::string name = (data[0] & 1)
                               ? normd::state::SnapshotFileName(sequence)
                               : normd::state::SegmentFileName(1);
  {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(data + 1),
              static_cast<std::streamsize>(size - 1));
  }
  normd::ModelStore store;
  normd::state::RecoveryReport report;
  auto state = normd::state::DurableState::Open({dir, 1 << 20}, store, &report);
  if (state.ok()) {
    // A recovered store must write and reread the same state.
    (void)(*state)->Snapshot();
  }
  // The decoders on their own, too.
  normd::state::MutationRecord record;
  (void)normd::state::DecodeMutation(
      absl::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
      &record);
  return 0;
}
