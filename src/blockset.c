/* blockset.c: an intrusive ordered set, a red-black tree with parent pointers.
 *
 * Nodes live inside the objects they order (the policies' blocks), so inserting and
 * erasing allocate nothing. The comparator gives the order - or, in a keyed set, up to three
 * 64-bit fields of the object around each node, compared inline (a call per comparison cost
 * the policies 5-9% of their time per event; the comparator then only checks the set in
 * _stash_bs_valid). Ties are not allowed (the policies break them by address). Lookups,
 * inserts and erases are O(log n); putting a node in the place of another that orders there
 * (_stash_bs_replace) is O(1); next/prev are amortized O(1).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

void _stash_bs_init(blockset_t* s, bs_cmp_fn cmp) { _stash_bs_init_keys(s, cmp, 0, 0, 0, 0); }

void _stash_bs_init_keys(blockset_t* s, bs_cmp_fn cmp, int nkeys, ptrdiff_t k0, ptrdiff_t k1,
                         ptrdiff_t k2) {
  s->root = NULL;
  s->cmp = cmp;
  s->count = 0;
  s->nkeys = nkeys;
  s->key[0] = k0;
  s->key[1] = k1;
  s->key[2] = k2;
}

static inline uint64_t key_at(const bs_node_t* n, ptrdiff_t off) {
  uint64_t v;
  memcpy(&v, (const char*)n + off, sizeof v);
  return v;
}

/* The set's order: its key fields in turn, or its comparator. */
static inline int compare(const blockset_t* s, const bs_node_t* a, const bs_node_t* b) {
  if (!s->nkeys) return s->cmp(a, b);
  for (int i = 0; i < s->nkeys; i++) {
    uint64_t x = key_at(a, s->key[i]), y = key_at(b, s->key[i]);
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

static void rotate_left(blockset_t* s, bs_node_t* x) {
  bs_node_t* y = x->right;
  x->right = y->left;
  if (y->left) y->left->parent = x;
  y->parent = x->parent;
  if (!x->parent) s->root = y;
  else if (x == x->parent->left) x->parent->left = y;
  else x->parent->right = y;
  y->left = x;
  x->parent = y;
}

static void rotate_right(blockset_t* s, bs_node_t* x) {
  bs_node_t* y = x->left;
  x->left = y->right;
  if (y->right) y->right->parent = x;
  y->parent = x->parent;
  if (!x->parent) s->root = y;
  else if (x == x->parent->right) x->parent->right = y;
  else x->parent->left = y;
  y->right = x;
  x->parent = y;
}

/* Where z goes: its parent y (NULL: the root) and the side (c < 0: left); false if a node
 * orders as z does. The descent compares z's own keys, read once, with each node's. */
static inline bool descend(const blockset_t* s, const bs_node_t* z, bs_node_t** py, int* pc) {
  bs_node_t* y = NULL;
  bs_node_t* x = s->root;
  int c = 0;
  if (s->nkeys == 2) {
    ptrdiff_t o0 = s->key[0], o1 = s->key[1];
    uint64_t z0 = key_at(z, o0), z1 = key_at(z, o1);
    while (x) {
      y = x;
      uint64_t x0 = key_at(x, o0);
      if (z0 != x0) c = z0 < x0 ? -1 : 1;
      else {
        uint64_t x1 = key_at(x, o1);
        if (z1 == x1) return false;
        c = z1 < x1 ? -1 : 1;
      }
      x = c < 0 ? x->left : x->right;
    }
  } else if (s->nkeys == 1) {
    ptrdiff_t o0 = s->key[0];
    uint64_t z0 = key_at(z, o0);
    while (x) {
      y = x;
      uint64_t x0 = key_at(x, o0);
      if (z0 == x0) return false;
      c = z0 < x0 ? -1 : 1;
      x = c < 0 ? x->left : x->right;
    }
  } else {
    while (x) {
      y = x;
      c = compare(s, z, x);
      if (c == 0) return false;
      x = c < 0 ? x->left : x->right;
    }
  }
  *py = y;
  *pc = c;
  return true;
}

bool _stash_bs_insert(blockset_t* s, bs_node_t* z) {
  bs_node_t* y;
  int c;
  if (!descend(s, z, &y, &c)) return false;
  z->parent = y;
  z->left = z->right = NULL;
  z->red = 1;
  if (!y) s->root = z;
  else if (c < 0) y->left = z;
  else y->right = z;
  s->count++;

  bs_node_t* p;
  while ((p = z->parent) && p->red) {
    bs_node_t* g = p->parent; /* exists: a red node is never the root */
    if (p == g->left) {
      bs_node_t* u = g->right;
      if (u && u->red) {
        p->red = 0;
        u->red = 0;
        g->red = 1;
        z = g;
        continue;
      }
      if (z == p->right) {
        rotate_left(s, p);
        z = p;
        p = z->parent;
      }
      p->red = 0;
      g->red = 1;
      rotate_right(s, g);
    } else {
      bs_node_t* u = g->left;
      if (u && u->red) {
        p->red = 0;
        u->red = 0;
        g->red = 1;
        z = g;
        continue;
      }
      if (z == p->left) {
        rotate_right(s, p);
        z = p;
        p = z->parent;
      }
      p->red = 0;
      g->red = 1;
      rotate_left(s, g);
    }
  }
  s->root->red = 0;
  return true;
}

static void transplant(blockset_t* s, bs_node_t* u, bs_node_t* v) {
  if (!u->parent) s->root = v;
  else if (u == u->parent->left) u->parent->left = v;
  else u->parent->right = v;
  if (v) v->parent = u->parent;
}

void _stash_bs_replace(blockset_t* s, bs_node_t* old, bs_node_t* n) {
  *n = *old;
  if (!old->parent) s->root = n;
  else if (old == old->parent->left) old->parent->left = n;
  else old->parent->right = n;
  if (n->left) n->left->parent = n;
  if (n->right) n->right->parent = n;
  old->left = old->right = old->parent = NULL;
}

static bs_node_t* subtree_min(bs_node_t* n) {
  while (n->left) n = n->left;
  return n;
}

static bs_node_t* subtree_max(bs_node_t* n) {
  while (n->right) n = n->right;
  return n;
}

static bool is_red(const bs_node_t* n) { return n && n->red; }

static void erase_fixup(blockset_t* s, bs_node_t* x, bs_node_t* xp) {
  while (x != s->root && !is_red(x)) {
    if (x == xp->left) {
      bs_node_t* w = xp->right;
      if (w->red) {
        w->red = 0;
        xp->red = 1;
        rotate_left(s, xp);
        w = xp->right;
      }
      if (!is_red(w->left) && !is_red(w->right)) {
        w->red = 1;
        x = xp;
        xp = x->parent;
      } else {
        if (!is_red(w->right)) {
          w->left->red = 0;
          w->red = 1;
          rotate_right(s, w);
          w = xp->right;
        }
        w->red = xp->red;
        xp->red = 0;
        if (w->right) w->right->red = 0;
        rotate_left(s, xp);
        x = s->root;
        break;
      }
    } else {
      bs_node_t* w = xp->left;
      if (w->red) {
        w->red = 0;
        xp->red = 1;
        rotate_right(s, xp);
        w = xp->left;
      }
      if (!is_red(w->left) && !is_red(w->right)) {
        w->red = 1;
        x = xp;
        xp = x->parent;
      } else {
        if (!is_red(w->left)) {
          w->right->red = 0;
          w->red = 1;
          rotate_left(s, w);
          w = xp->left;
        }
        w->red = xp->red;
        xp->red = 0;
        if (w->left) w->left->red = 0;
        rotate_right(s, xp);
        x = s->root;
        break;
      }
    }
  }
  if (x) x->red = 0;
}

void _stash_bs_erase(blockset_t* s, bs_node_t* z) {
  bs_node_t* y = z;
  int y_red = y->red;
  bs_node_t* x;
  bs_node_t* xp;
  if (!z->left) {
    x = z->right;
    xp = z->parent;
    transplant(s, z, z->right);
  } else if (!z->right) {
    x = z->left;
    xp = z->parent;
    transplant(s, z, z->left);
  } else {
    y = subtree_min(z->right);
    y_red = y->red;
    x = y->right;
    if (y->parent == z) {
      xp = y;
    } else {
      xp = y->parent;
      transplant(s, y, y->right);
      y->right = z->right;
      y->right->parent = y;
    }
    transplant(s, z, y);
    y->left = z->left;
    y->left->parent = y;
    y->red = z->red;
  }
  s->count--;
  if (!y_red) erase_fixup(s, x, xp);
  z->left = z->right = z->parent = NULL;
}

bs_node_t* _stash_bs_lower_bound(const blockset_t* s, const bs_node_t* key) {
  bs_node_t* x = s->root;
  bs_node_t* best = NULL;
  if (s->nkeys == 2) { /* the key's fields read once */
    ptrdiff_t o0 = s->key[0], o1 = s->key[1];
    uint64_t k0 = key_at(key, o0), k1 = key_at(key, o1);
    while (x) {
      uint64_t x0 = key_at(x, o0);
      if (x0 < k0 || (x0 == k0 && key_at(x, o1) < k1)) {
        x = x->right;
      } else {
        best = x;
        x = x->left;
      }
    }
    return best;
  }
  while (x) {
    if (compare(s, x, key) < 0) {
      x = x->right;
    } else {
      best = x;
      x = x->left;
    }
  }
  return best;
}

bs_node_t* _stash_bs_first(const blockset_t* s) { return s->root ? subtree_min(s->root) : NULL; }
bs_node_t* _stash_bs_last(const blockset_t* s) { return s->root ? subtree_max(s->root) : NULL; }

bs_node_t* _stash_bs_next(const bs_node_t* n) {
  if (n->right) return subtree_min(n->right);
  const bs_node_t* p = n->parent;
  while (p && n == p->right) {
    n = p;
    p = p->parent;
  }
  return (bs_node_t*)p;
}

bs_node_t* _stash_bs_prev(const bs_node_t* n) {
  if (n->left) return subtree_max(n->left);
  const bs_node_t* p = n->parent;
  while (p && n == p->left) {
    n = p;
    p = p->parent;
  }
  return (bs_node_t*)p;
}

/* Black height of the subtree, or -1 if an invariant fails below n. */
static int check_subtree(const blockset_t* s, const bs_node_t* n, size_t* count) {
  if (!n) return 1;
  (*count)++;
  if (n->left && (n->left->parent != n || s->cmp(n->left, n) >= 0)) return -1;
  if (n->right && (n->right->parent != n || s->cmp(n->right, n) <= 0)) return -1;
  if (n->red && (is_red(n->left) || is_red(n->right))) return -1;
  int hl = check_subtree(s, n->left, count);
  int hr = check_subtree(s, n->right, count);
  if (hl < 0 || hr < 0 || hl != hr) return -1;
  return hl + (n->red ? 0 : 1);
}

bool _stash_bs_valid(const blockset_t* s) {
  if (!s->root) return s->count == 0;
  if (s->root->red || s->root->parent) return false;
  size_t count = 0;
  if (check_subtree(s, s->root, &count) < 0) return false;
  if (count != s->count) return false;
  /* Local order checks are not enough for a BST: walk in order. */
  const bs_node_t* prev = NULL;
  for (const bs_node_t* n = _stash_bs_first(s); n; n = _stash_bs_next(n)) {
    if (prev && s->cmp(prev, n) >= 0) return false;
    prev = n;
  }
  return true;
}
