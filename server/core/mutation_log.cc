#include "server/core/mutation_log.h"

namespace normd {

namespace {
thread_local DeferDurability* current_defer_durability = nullptr;
}  // namespace

DeferDurability::DeferDurability() : outer_(current_defer_durability) {
  current_defer_durability = this;
}

DeferDurability::~DeferDurability() {
  current_defer_durability = outer_;
  if (outer_ != nullptr) outer_->Note(sequence_);
}

DeferDurability* DeferDurability::Current() { return current_defer_durability; }

}  // namespace normd
