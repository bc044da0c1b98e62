/* snapshot.h: the calls recorded in a PyTorch memory snapshot (torch.cuda.memory._snapshot()
 * with record_memory_history on), read without Python. */
#ifndef STASH_SNAPSHOT_H
#define STASH_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { SNAPSHOT_ALLOC = 0, SNAPSHOT_FREE = 1 };

/* Called for each "alloc" and each "free_completed" entry of the device's trace, in order
 * (index: the entry's 1-based position in the trace). Return false to stop (the callback
 * has written err). */
typedef bool (*snapshot_event_fn)(void* arg, int kind, uint64_t addr, uint64_t size,
                                  uint64_t stream, uint64_t index);

typedef struct snapshot_info_s {
  size_t devices; /* device traces in the snapshot */
  int device;     /* the one read */
  size_t entries; /* its trace entries, of every action */
} snapshot_info_t;

/* Parse the pickle in data (already decompressed) and walk device's trace (device < 0: the
 * first device with entries). On failure returns false with a message in err (the byte
 * offset for a malformed pickle, the event for a malformed entry). */
bool snapshot_read(const unsigned char* data, size_t n, int device, snapshot_event_fn fn,
                   void* arg, snapshot_info_t* info, char* err, size_t errlen);

#endif
