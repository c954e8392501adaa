// AioWorker: the libaio submission/completion loop (see aio_worker.h).
#include "ops/aio/aio_worker.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace deepspeed::aio::detail {
namespace {

constexpr int64_t kAlign = kDirectIoAlignment;

int64_t round_up(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

bool aligned_ptr(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlign == 0; }

// One request in flight: where its bytes go, and whether they pass through the bounce buffer.
struct Slot {
  struct iocb cb;
  int64_t offset = 0;  // in the file and in the tensor
  int64_t len = 0;     // bytes of the tensor this request covers
  int64_t io_len = 0;  // bytes asked of the kernel (len rounded up to kAlign when bounced)
  char* user = nullptr;
  char* staging = nullptr;  // nullptr: the kernel reads/writes `user` directly
};

}  // namespace

AioWorker::AioWorker(const AioOptions& options,
                     std::function<void(TransferPart&, const std::string&)> on_part_done)
    : options_(options), on_part_done_(std::move(on_part_done)) {
  const int rc = io_setup(static_cast<int>(options_.queue_depth), &context_);
  if (rc < 0) {
    throw AioError("aio: io_setup(" + std::to_string(options_.queue_depth) +
                   ") failed: " + errno_text(-rc) +
                   (-rc == EAGAIN ? "; raise fs.aio-max-nr or lower aio.queue_depth" : ""));
  }
  thread_ = std::thread([this] { run(); });
}

AioWorker::~AioWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  io_destroy(context_);
}

void AioWorker::enqueue(TransferPart part) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(part));
  }
  wake_.notify_one();
}

void AioWorker::run() {
  for (;;) {
    TransferPart part;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      // The owner drains every transfer before destroying workers, so stopping never drops one.
      if (queue_.empty()) return;
      part = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string error;
    try {
      error = transfer(part);
    } catch (const std::exception& e) {
      error = std::string("aio: ") + e.what();
    }
    on_part_done_(part, error);
  }
}

char* AioWorker::bounce_buffer() {
  if (!bounce_) {
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(options_.queue_depth * options_.block_size);
    if (posix_memalign(&p, kAlign, bytes) != 0) throw std::bad_alloc();
    bounce_ = std::unique_ptr<char, void (*)(void*)>(static_cast<char*>(p), std::free);
  }
  return bounce_.get();
}

std::string AioWorker::transfer(const TransferPart& part) {
  Transfer& t = *part.transfer;
  const bool direct = t.fd.direct();
  const int64_t block = options_.block_size;
  const int depth = static_cast<int>(options_.queue_depth);
  const char* verb = t.write ? "write" : "read";

  std::vector<Slot> slots(static_cast<size_t>(depth));
  std::vector<int> free_slots;
  for (int s = depth - 1; s >= 0; --s) free_slots.push_back(s);
  std::vector<struct iocb*> batch;
  std::vector<struct io_event> events(static_cast<size_t>(depth));
  int64_t next = part.begin;
  int inflight = 0;
  std::string error;
  auto fail = [&](const std::string& e) {
    if (error.empty()) error = e;
  };
  auto where = [&](int64_t offset) {
    return "aio: " + std::string(verb) + " of " + t.path + " failed at offset " +
           std::to_string(offset) + ": ";
  };

  auto prepare = [&](int s) {
    Slot& sl = slots[static_cast<size_t>(s)];
    sl.offset = next;
    sl.len = std::min(block, part.end - next);
    next += sl.len;
    sl.user = t.data + sl.offset;
    sl.staging = nullptr;
    sl.io_len = sl.len;
    char* io_buf = sl.user;
    if (direct && !(aligned_ptr(sl.user) && sl.len % kAlign == 0)) {
      sl.staging = bounce_buffer() + static_cast<int64_t>(s) * block;
      sl.io_len = round_up(sl.len, kAlign);
      if (t.write) {
        std::memcpy(sl.staging, sl.user, static_cast<size_t>(sl.len));
        std::memset(sl.staging + sl.len, 0, static_cast<size_t>(sl.io_len - sl.len));
      }
      io_buf = sl.staging;
    }
    if (t.write) {
      io_prep_pwrite(&sl.cb, t.fd.get(), io_buf, static_cast<size_t>(sl.io_len), sl.offset);
    } else {
      io_prep_pread(&sl.cb, t.fd.get(), io_buf, static_cast<size_t>(sl.io_len), sl.offset);
    }
    sl.cb.data = &sl;
  };

  auto submit = [&]() {
    size_t done = 0;
    while (done < batch.size()) {
      // single_submit: one request per io_submit call (DeepSpeed's option for devices that
      // handle batched submission poorly); otherwise the whole batch in one call.
      const long n = options_.single_submit ? 1 : static_cast<long>(batch.size() - done);
      const int rc = io_submit(context_, n, batch.data() + done);
      if (rc == -EINTR || rc == -EAGAIN) {
        if (rc == -EAGAIN && inflight > 0) break;  // the kernel is full: reap some first
        continue;
      }
      if (rc < 0) {
        fail(where(static_cast<Slot*>(batch[done]->data)->offset) + "io_submit: " +
             errno_text(-rc));
        break;
      }
      done += static_cast<size_t>(rc);
      inflight += rc;
    }
    // Requests not submitted (error or EAGAIN) go back: their blocks are re-prepared later
    // (EAGAIN) or abandoned (error).
    for (size_t i = batch.size(); i > done; --i) {
      Slot* sl = static_cast<Slot*>(batch[i - 1]->data);
      free_slots.push_back(static_cast<int>(sl - slots.data()));
      if (error.empty()) next = std::min(next, sl->offset);
    }
    batch.clear();
  };

  auto complete = [&](const struct io_event& ev) {
    Slot& sl = *static_cast<Slot*>(ev.data);
    free_slots.push_back(static_cast<int>(&sl - slots.data()));
    --inflight;
    const long res = static_cast<long>(ev.res);
    if (res < 0) {
      fail(where(sl.offset) + errno_text(static_cast<int>(-res)));
    } else if (t.write && res != sl.io_len) {
      fail(where(sl.offset) + "short write (" + std::to_string(res) + " of " +
           std::to_string(sl.io_len) + " bytes); is the device full?");
    } else if (!t.write && res < sl.len) {
      fail(where(sl.offset) + "unexpected end of file (" + std::to_string(res) + " of " +
           std::to_string(sl.len) + " bytes); was the file truncated while being read?");
    } else if (!t.write && sl.staging != nullptr) {
      std::memcpy(sl.user, sl.staging, static_cast<size_t>(sl.len));
    }
  };

  for (;;) {
    while (error.empty() && next < part.end && !free_slots.empty()) {
      const int s = free_slots.back();
      free_slots.pop_back();
      prepare(s);
      batch.push_back(&slots[static_cast<size_t>(s)].cb);
    }
    if (!batch.empty()) submit();
    if (inflight == 0) {
      if (error.empty() && next < part.end) continue;  // EAGAIN with nothing in flight: retry
      break;
    }
    // overlap_events: refill as soon as one request completes; otherwise wait for the whole
    // batch before submitting the next one.
    const long min_nr = options_.overlap_events ? 1 : inflight;
    const int n = io_getevents(context_, min_nr, depth, events.data(), nullptr);
    if (n == -EINTR) continue;
    if (n < 0) {
      // The context is unusable; requests still in flight cannot be reaped safely, so the
      // worker stops here (their buffers stay alive through the transfer's keep_alive).
      return where(next) + "io_getevents: " + errno_text(-n);
    }
    for (int i = 0; i < n; ++i) complete(events[static_cast<size_t>(i)]);
  }
  return error;
}

}  // namespace deepspeed::aio::detail
