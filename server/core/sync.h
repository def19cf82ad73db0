// normd's mutex types. In normal builds they are Abseil's (absl::Mutex,
// MutexLock, ReaderMutexLock). Under ThreadSanitizer they are built on the
// standard library instead: Debian's Abseil is not compiled with TSan, so
// TSan cannot see absl::Mutex synchronize and would report false races on
// everything it guards. The TSan variant keeps the subset of the absl::Mutex
// API normd uses (exclusive and shared locking, Await on an absl::Condition)
// and is slower (every unlock wakes every waiter), which only tests see.
//
// Thread-safe, as mutexes are.
#ifndef NORMD_SERVER_CORE_SYNC_H_
#define NORMD_SERVER_CORE_SYNC_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#endif

namespace normd {

#if !defined(__SANITIZE_THREAD__)

using Mutex = absl::Mutex;
using MutexLock = absl::MutexLock;
using ReaderMutexLock = absl::ReaderMutexLock;

#else

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_.unlock();
    changed_.notify_all();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }
  // Requires the exclusive lock; returns holding it with `condition` true.
  void Await(const absl::Condition& condition) {
    std::unique_lock<std::shared_mutex> lock(mu_, std::adopt_lock);
    changed_.wait(lock, [&] { return condition.Eval(); });
    lock.release();
  }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() {}

 private:
  std::shared_mutex mu_;
  std::condition_variable_any changed_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

#endif

}  // namespace normd

#endif  // NORMD_SERVER_CORE_SYNC_H_
