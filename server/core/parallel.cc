#include "server/core/parallel.h"

namespace normd {

tbb::task_arena& ComputeArena() {
  // Never destroyed: tasks may still be finishing while the process exits.
  static tbb::task_arena* arena = [] {
    auto* a = new tbb::task_arena();
    a->initialize();
    return a;
  }();
  return *arena;
}

}  // namespace normd
