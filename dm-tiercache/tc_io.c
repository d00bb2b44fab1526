// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: buffers of page chunks and bios over them.
 *
 * A writeback request gathers many cache slots into one buffer and writes
 * it to the origin as one bio.  The buffer is made of compound pages of up
 * to 64 KiB so that a bio of BIO_MAX_VECS vectors carries up to 16 MiB;
 * when memory is fragmented it falls back to single pages.
 */
#include <linux/slab.h>
#include <linux/mm.h>

#include "tiercache.h"

#define TC_BUF_MAX_ORDER	4

void tc_buf_free(struct tc_buf *b)
{
	unsigned int i;

	if (!b->chunks)
		return;
	for (i = 0; i < b->nr_chunks; i++)
		if (b->chunks[i])
			__free_pages(b->chunks[i], get_order(b->chunk_bytes));
	kfree(b->chunks);
	b->chunks = NULL;
	b->nr_chunks = 0;
}

static int tc_buf_alloc_order(struct tc_buf *b, size_t bytes,
			      unsigned int order)
{
	gfp_t gfp = GFP_NOIO;
	unsigned int i;

	if (order)
		gfp |= __GFP_COMP | __GFP_NORETRY | __GFP_NOWARN;
	b->chunk_bytes = PAGE_SIZE << order;
	b->nr_chunks = DIV_ROUND_UP(bytes, b->chunk_bytes);
	b->chunks = kcalloc(b->nr_chunks, sizeof(*b->chunks), GFP_NOIO);
	if (!b->chunks)
		return -ENOMEM;
	for (i = 0; i < b->nr_chunks; i++) {
		b->chunks[i] = alloc_pages(gfp, order);
		if (!b->chunks[i]) {
			tc_buf_free(b);
			return -ENOMEM;
		}
	}
	return 0;
}

int tc_buf_alloc(struct tc_buf *b, size_t bytes)
{
	unsigned int order = min_t(unsigned int, get_order(bytes),
				   TC_BUF_MAX_ORDER);

	if (order && !tc_buf_alloc_order(b, bytes, order))
		return 0;
	return tc_buf_alloc_order(b, bytes, 0);
}

/*
 * A bio over @len bytes of @b from offset @off.  When the bio runs out of
 * vectors it covers less; @len is updated to what it covers.
 */
struct bio *tc_buf_bio(struct tc_cache *c, struct tc_buf *b, size_t off,
		       size_t *len, struct block_device *bdev, sector_t sector,
		       blk_opf_t opf)
{
	unsigned int first = off / b->chunk_bytes;
	unsigned int last = (off + *len - 1) / b->chunk_bytes;
	unsigned short nr_vecs = min_t(unsigned int, last - first + 1,
				       BIO_MAX_VECS);
	size_t done = 0;
	struct bio *bio;

	bio = bio_alloc_bioset(bdev, nr_vecs, opf, GFP_NOIO, &c->bs);
	bio->bi_iter.bi_sector = sector;
	while (done < *len) {
		size_t pos = off + done;
		unsigned int in = pos % b->chunk_bytes;
		unsigned int piece = min_t(size_t, *len - done,
					   b->chunk_bytes - in);
		struct page *pg = nth_page(b->chunks[pos / b->chunk_bytes],
					   in >> PAGE_SHIFT);

		if (bio_add_page(bio, pg, piece, offset_in_page(in)) != piece)
			break;
		done += piece;
	}
	*len = done;
	return bio;
}
