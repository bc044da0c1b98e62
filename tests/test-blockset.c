/* test-blockset: the ordered set (red-black tree) against a sorted reference array. */
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
  RUN(ptrmap_put_get_take);
  RUN(slab_reuses_objects);
  TEST_MAIN_END();
}
