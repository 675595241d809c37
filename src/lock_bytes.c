/* Lock bytes: an AVL tree of disjoint byte ranges keyed by start (see
 * lock_bytes.h). Every operation is O(log n) in the number of ranges but
 * add and remove, which are O(log n) for each range they join or cut. */
#include "lock_bytes.h"

#include <string.h>

void lock_bytes_init(struct lock_bytes *set)
{
    memset(set, 0, sizeof(*set));
    node_pool_init(&set->pool, sizeof(struct lock_bytes_node));
}

void lock_bytes_destroy(struct lock_bytes *set)
{
    node_pool_destroy(&set->pool);
    set->root = NULL;
    set->count = 0;
}

static int height_of(const struct lock_bytes_node *node)
{
    return node != NULL ? node->height : 0;
}

static void update_height(struct lock_bytes_node *node)
{
    int left = height_of(node->left), right = height_of(node->right);
    node->height = (left > right ? left : right) + 1;
}

static struct lock_bytes_node *rotate_right(struct lock_bytes_node *node)
{
    struct lock_bytes_node *pivot = node->left;
    node->left = pivot->right;
    pivot->right = node;
    update_height(node);
    update_height(pivot);
    return pivot;
}

static struct lock_bytes_node *rotate_left(struct lock_bytes_node *node)
{
    struct lock_bytes_node *pivot = node->right;
    node->right = pivot->left;
    pivot->left = node;
    update_height(node);
    update_height(pivot);
    return pivot;
}

static struct lock_bytes_node *rebalance(struct lock_bytes_node *node)
{
    update_height(node);
    int balance = height_of(node->left) - height_of(node->right);
    if (balance > 1) {
        if (height_of(node->left->left) < height_of(node->left->right))
            node->left = rotate_left(node->left);
        return rotate_right(node);
    }
    if (balance < -1) {
        if (height_of(node->right->right) < height_of(node->right->left))
            node->right = rotate_right(node->right);
        return rotate_left(node);
    }
    return node;
}

static struct lock_bytes_node *insert_node(struct lock_bytes_node *subtree,
                                           struct lock_bytes_node *node)
{
    if (subtree == NULL)
        return node;
    if (node->start < subtree->start)
        subtree->left = insert_node(subtree->left, node);
    else
        subtree->right = insert_node(subtree->right, node);
    return rebalance(subtree);
}

static struct lock_bytes_node *detach_min(struct lock_bytes_node *subtree,
                                          struct lock_bytes_node **min)
{
    if (subtree->left == NULL) {
        *min = subtree;
        return subtree->right;
    }
    subtree->left = detach_min(subtree->left, min);
    return rebalance(subtree);
}

/* Removes the node keyed start (which exists) and hands it back in *removed. */
static struct lock_bytes_node *remove_node(struct lock_bytes_node *subtree, uintptr_t start,
                                           struct lock_bytes_node **removed)
{
    if (start < subtree->start) {
        subtree->left = remove_node(subtree->left, start, removed);
    } else if (start > subtree->start) {
        subtree->right = remove_node(subtree->right, start, removed);
    } else {
        *removed = subtree;
        if (subtree->left == NULL)
            return subtree->right;
        if (subtree->right == NULL)
            return subtree->left;
        struct lock_bytes_node *successor;
        struct lock_bytes_node *right = detach_min(subtree->right, &successor);
        successor->left = subtree->left;
        successor->right = right;
        return rebalance(successor);
    }
    return rebalance(subtree);
}

/* The range with the greatest start at or below address, or NULL. */
static struct lock_bytes_node *floor_node(struct lock_bytes_node *node, uintptr_t address)
{
    struct lock_bytes_node *found = NULL;
    while (node != NULL) {
        if (node->start <= address) {
            found = node;
            node = node->right;
        } else {
            node = node->left;
        }
    }
    return found;
}

/* The range with the least start above address, or NULL. */
static struct lock_bytes_node *ceiling_above(struct lock_bytes_node *node, uintptr_t address)
{
    struct lock_bytes_node *found = NULL;
    while (node != NULL) {
        if (node->start > address) {
            found = node;
            node = node->left;
        } else {
            node = node->right;
        }
    }
    return found;
}

static void drop(struct lock_bytes *set, uintptr_t start)
{
    struct lock_bytes_node *removed = NULL;
    set->root = remove_node(set->root, start, &removed);
    node_pool_put(&set->pool, removed);
    set->count--;
}

static bool put(struct lock_bytes *set, uintptr_t low, uintptr_t high)
{
    struct lock_bytes_node *node = node_pool_get(&set->pool);
    if (node == NULL)
        return false;
    node->start = low;
    node->end = high;
    node->height = 1;
    set->root = insert_node(set->root, node);
    set->count++;
    return true;
}

bool lock_bytes_reserve(struct lock_bytes *set, size_t count)
{
    return node_pool_reserve(&set->pool, count);
}

bool lock_bytes_add(struct lock_bytes *set, uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return true;
    if (!node_pool_reserve(&set->pool, 1))
        return false;
    /* Every range that overlaps or touches [start, end) joins it: the one
     * starting at or before start, and those starting inside. */
    struct lock_bytes_node *before = floor_node(set->root, start);
    if (before != NULL && before->end >= start) {
        if (before->end >= end)
            return true; /* held already */
        start = before->start;
    }
    for (;;) {
        struct lock_bytes_node *node = floor_node(set->root, end);
        if (node == NULL || node->end < start)
            break;
        if (node->end > end)
            end = node->end;
        if (node->start < start)
            start = node->start;
        drop(set, node->start);
    }
    return put(set, start, end);
}

bool lock_bytes_remove(struct lock_bytes *set, uintptr_t start, uintptr_t end)
{
    bool complete = true;
    while (start < end) {
        struct lock_bytes_node *node = end > 0 ? floor_node(set->root, end - 1) : NULL;
        if (node == NULL || node->end <= start)
            break;
        uintptr_t node_start = node->start, node_end = node->end;
        drop(set, node_start);
        if (node_end > end && !put(set, end, node_end))
            complete = false;
        if (node_start < start && !put(set, node_start, start))
            complete = false;
    }
    return complete;
}

bool lock_bytes_any(const struct lock_bytes *set, uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return false;
    struct lock_bytes_node *node = floor_node(set->root, end - 1);
    return node != NULL && node->end > start;
}

bool lock_bytes_next(const struct lock_bytes *set, uintptr_t from, uintptr_t *start, uintptr_t *end)
{
    struct lock_bytes_node *node = floor_node(set->root, from);
    if (node == NULL || node->end <= from)
        node = ceiling_above(set->root, from);
    if (node == NULL)
        return false;
    *start = node->start;
    *end = node->end;
    return true;
}

uint64_t lock_bytes_count(const struct lock_bytes *set, uintptr_t start, uintptr_t end,
                          uint64_t limit)
{
    uint64_t total = 0;
    uintptr_t cursor = start, from, to;
    while (cursor < end && total < limit && lock_bytes_next(set, cursor, &from, &to) &&
           from < end) {
        uintptr_t low = from > cursor ? from : cursor;
        uintptr_t high = to < end ? to : end;
        total += high - low;
        cursor = high;
    }
    return total;
}
