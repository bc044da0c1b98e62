/* test-blockset: the ordered set (red-black tree) against a sorted reference array. */
#include <stddef.h>
#include <stdlib.h>

#include "internal.h"
#include "testhelper.h"

typedef struct item_s {
  bs_node_t node;
  uint64_t key;
} item_t;

static int cmp(const bs_node_t* a, const bs_node_t* b) {
  uint64_t x = ((const item_t*)a)->key, y = ((const item_t*)b)->key;
  return x < y ? -1 : x > y;
}

static uint64_t rng_state = 12345;
static uint64_t rnd(void) { return th_random(&rng_state); }

#define N 4000

TEST(random_ops_match_reference) {
  static item_t items[N];
  static bool in[N];
  blockset_t s;
  _stash_bs_init(&s, cmp);
  for (int i = 0; i < N; i++) items[i].key = (uint64_t)i * 3 + 1; /* distinct keys */
  for (int round = 0; round < 60000; round++) {
    int i = (int)(rnd() % N);
    if (in[i]) {
      _stash_bs_erase(&s, &items[i].node);
      in[i] = false;
    } else {
      CHECK(_stash_bs_insert(&s, &items[i].node));
      in[i] = true;
    }
    if (round % 5000 == 0) CHECK(_stash_bs_valid(&s));
    /* lower_bound of a random key equals the first inserted key >= it */
    item_t probe = {.key = rnd() % (3 * N + 5)};
    bs_node_t* lb = _stash_bs_lower_bound(&s, &probe.node);
    int want = -1;
    for (int k = (int)(probe.key / 3); k < N; k++) {
      if (k >= 0 && in[k] && items[k].key >= probe.key) {
        want = k;
        break;
      }
    }
    if (want < 0) CHECK(lb == NULL);
    else CHECK(lb == &items[want].node);
  }
  CHECK(_stash_bs_valid(&s));
  /* in-order walk forwards and backwards */
  size_t count = 0;
  uint64_t prev = 0;
  for (bs_node_t* n = _stash_bs_first(&s); n; n = _stash_bs_next(n)) {
    CHECK(((item_t*)n)->key > prev || count == 0);
    prev = ((item_t*)n)->key;
    count++;
  }
  CHECK_EQ(count, s.count);
  size_t back = 0;
  for (bs_node_t* n = _stash_bs_last(&s); n; n = _stash_bs_prev(n)) back++;
  CHECK_EQ(back, s.count);
}

TEST(duplicate_insert_refused) {
  item_t a = {.key = 5}, b = {.key = 5};
  blockset_t s;
  _stash_bs_init(&s, cmp);
  CHECK(_stash_bs_insert(&s, &a.node));
  CHECK(!_stash_bs_insert(&s, &b.node));
  CHECK_EQ(s.count, 1);
  _stash_bs_erase(&s, &a.node);
  CHECK(s.root == NULL);
  CHECK(_stash_bs_valid(&s));
}

/* A node put in another's place, keyed anywhere between that one's neighbours, takes over
 * its place: the tree stays valid (parent links, colours, order), it is found where the old
 * one was, and the old one is out of the tree - then erased and inserted like any other. */
TEST(replace_takes_the_place_of_a_node) {
  static item_t items[2][N];
  static bool in[N];
  static int which[N]; /* the items[][i] in the set */
  blockset_t s;
  _stash_bs_init(&s, cmp);
  for (int i = 0; i < N; i++) items[0][i].key = (uint64_t)i * 4 + 2; /* gaps of 3 keys */
  for (int i = 0; i < N; i++) {
    if (rnd() % 3) {
      CHECK(_stash_bs_insert(&s, &items[0][i].node));
      in[i] = true;
    }
  }
  for (int round = 0; round < 40000; round++) {
    int i = (int)(rnd() % N);
    if (!in[i]) continue;
    item_t* old = &items[which[i]][i];
    item_t* nw = &items[!which[i]][i];
    nw->key = (uint64_t)i * 4 + 1 + rnd() % 3; /* anywhere in its gap */
    _stash_bs_replace(&s, &old->node, &nw->node);
    which[i] = !which[i];
    CHECK(old->node.parent == NULL && old->node.left == NULL && old->node.right == NULL);
    CHECK(_stash_bs_lower_bound(&s, &nw->node) == &nw->node);
    if (round % 4000 == 0) CHECK(_stash_bs_valid(&s));
    if (round % 7 == 0) { /* and it leaves and comes back like any node */
      _stash_bs_erase(&s, &nw->node);
      CHECK(_stash_bs_insert(&s, &nw->node));
    }
  }
  CHECK(_stash_bs_valid(&s));
  size_t count = 0;
  for (bs_node_t* n = _stash_bs_first(&s); n; n = _stash_bs_next(n)) {
    int i = (int)((((item_t*)n)->key - 1) / 4);
    CHECK(in[i] && n == &items[which[i]][i].node);
    count++;
  }
  CHECK_EQ(count, s.count);
}

/* A set ordered by key fields (_stash_bs_init_keys): three 64-bit fields, one before the
 * node and two after it (one a pointer), compared in turn with no call; its walk, lower
 * bounds and checks agree with a comparator of the same order, and _stash_bs_valid (which
 * checks with the comparator) finds a set whose fields order otherwise. */
typedef struct keyed_s {
  uint64_t size;
  bs_node_t node;
  void* stream;
  uint64_t ptr;
} keyed_t;

#define KEY(f) ((ptrdiff_t)offsetof(keyed_t, f) - (ptrdiff_t)offsetof(keyed_t, node))
#define KEYED(n) ((const keyed_t*)((const char*)(n) - offsetof(keyed_t, node)))

static int cmp_keyed(const bs_node_t* a, const bs_node_t* b) {
  const keyed_t* x = KEYED(a);
  const keyed_t* y = KEYED(b);
  if (x->stream != y->stream) return (uintptr_t)x->stream < (uintptr_t)y->stream ? -1 : 1;
  if (x->size != y->size) return x->size < y->size ? -1 : 1;
  return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

static int cmp_keyed_sort(const void* a, const void* b) {
  return cmp_keyed(&(*(keyed_t* const*)a)->node, &(*(keyed_t* const*)b)->node);
}

TEST(a_keyed_set_orders_by_its_fields) {
  enum { M = 3000 };
  static keyed_t items[M];
  static bool in[M];
  static keyed_t* want[M];
  blockset_t s;
  _stash_bs_init_keys(&s, cmp_keyed, 3, KEY(stream), KEY(size), KEY(ptr));
  for (int i = 0; i < M; i++) { /* many equal streams and sizes: the later keys decide */
    items[i].stream = (void*)(uintptr_t)(0x1000 * (1 + rnd() % 3));
    items[i].size = 512 * (1 + rnd() % 16);
    items[i].ptr = (uint64_t)i << 20;
  }
  for (int round = 0; round < 20000; round++) {
    int i = (int)(rnd() % M);
    if (in[i]) _stash_bs_erase(&s, &items[i].node);
    else CHECK(_stash_bs_insert(&s, &items[i].node));
    in[i] = !in[i];
    keyed_t probe = {.size = 512 * (1 + rnd() % 17),
                     .stream = (void*)(uintptr_t)(0x1000 * (1 + rnd() % 3)),
                     .ptr = (rnd() % M) << 20};
    const bs_node_t* lb = _stash_bs_lower_bound(&s, &probe.node);
    const keyed_t* best = NULL; /* the least item not less than the probe */
    for (int k = 0; k < M; k++) {
      if (in[k] && cmp_keyed(&items[k].node, &probe.node) >= 0 &&
          (!best || cmp_keyed(&items[k].node, &best->node) < 0))
        best = &items[k];
    }
    CHECK(lb == (best ? &best->node : NULL));
  }
  CHECK(_stash_bs_valid(&s));
  size_t n = 0;
  for (int i = 0; i < M; i++)
    if (in[i]) want[n++] = &items[i];
  qsort(want, n, sizeof *want, cmp_keyed_sort);
  size_t k = 0;
  for (bs_node_t* x = _stash_bs_first(&s); x; x = _stash_bs_next(x), k++)
    CHECK(k < n && x == &want[k]->node);
  CHECK_EQ(k, n);
  /* the same items under fields that order otherwise (size before stream): the comparator
   * of the check disagrees, and says so */
  blockset_t other;
  _stash_bs_init_keys(&other, cmp_keyed, 3, KEY(size), KEY(stream), KEY(ptr));
  for (int i = 0; i < M; i++) {
    if (in[i]) _stash_bs_erase(&s, &items[i].node);
    CHECK(_stash_bs_insert(&other, &items[i].node));
  }
  CHECK(!_stash_bs_valid(&other));
}

TEST(ptrmap_put_get_take) {
  ptrmap_t m;
  _stash_ptrmap_init(&m);
  for (uint64_t i = 1; i <= 5000; i++) CHECK_OK(_stash_ptrmap_put(&m, i * 512, (void*)(uintptr_t)i));
  CHECK_EQ(m.count, 5000);
  for (uint64_t i = 1; i <= 5000; i += 2) CHECK(_stash_ptrmap_take(&m, i * 512) == (void*)(uintptr_t)i);
  for (uint64_t i = 1; i <= 5000; i++) {
    void* v = _stash_ptrmap_get(&m, i * 512);
    CHECK(v == ((i % 2) ? NULL : (void*)(uintptr_t)i));
  }
  CHECK(_stash_ptrmap_take(&m, 3) == NULL);
  CHECK_EQ(m.count, 2500);
  _stash_ptrmap_free(&m);
}

/* The longest run of occupied slots: what a lookup that misses may have to walk. */
static size_t longest_run(const ptrmap_t* m) {
  size_t best = 0, run = 0;
  for (size_t i = 0; i < 2 * m->cap; i++) { /* twice round: a run may wrap */
    run = m->slots[i & (m->cap - 1)].key ? run + 1 : 0;
    if (run > best) best = run;
  }
  return best < m->cap ? best : m->cap;
}

/* Keys that differ only in their high bits - virtual ranges reserved 4 GiB apart, pages
 * 2 MiB apart in a high address range - spread over the table as 512-byte steps do: the
 * home slot comes from every bit of the key. (Slots taken from the product's bits 17 and up,
 * as before the thirty-seventh session, put the 4 GiB keys all in one slot: a run of 2000.) */
TEST(ptrmap_spreads_high_bit_keys) {
  for (int pattern = 0; pattern < 3; pattern++) {
    ptrmap_t m;
    _stash_ptrmap_init(&m);
    for (uint64_t i = 1; i <= 2000; i++) {
      uint64_t key = pattern == 0 ? i << 32 : pattern == 1 ? 0x7f0000000000ull + (i << 21) : i * 512;
      CHECK_OK(_stash_ptrmap_put(&m, key, (void*)(uintptr_t)i));
    }
    CHECK_EQ(m.count, 2000);
    CHECK(longest_run(&m) <= 32);
    for (uint64_t i = 1; i <= 2000; i++) {
      uint64_t key = pattern == 0 ? i << 32 : pattern == 1 ? 0x7f0000000000ull + (i << 21) : i * 512;
      CHECK(_stash_ptrmap_get(&m, key) == (void*)(uintptr_t)i);
    }
    _stash_ptrmap_free(&m);
  }
}

TEST(slab_reuses_objects) {
  slab_t s;
  _stash_slab_init(&s, 40);
  void* a = _stash_slab_alloc(&s);
  void* b = _stash_slab_alloc(&s);
  CHECK(a && b && a != b);
  CHECK_EQ(s.live, 2);
  _stash_slab_free(&s, a);
  CHECK(_stash_slab_alloc(&s) == a);
  for (int i = 0; i < 10000; i++) CHECK(_stash_slab_alloc(&s) != NULL);
  _stash_slab_destroy(&s);
}

int main(void) {
  RUN(random_ops_match_reference);
  RUN(duplicate_insert_refused);
  RUN(replace_takes_the_place_of_a_node);
  RUN(a_keyed_set_orders_by_its_fields);
  RUN(ptrmap_put_get_take);
  RUN(ptrmap_spreads_high_bit_keys);
  RUN(slab_reuses_objects);
  TEST_MAIN_END();
}
