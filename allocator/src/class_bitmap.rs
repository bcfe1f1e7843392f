//! A three-level bitmap of the non-empty size classes of the free index: finding the first
//! non-empty class at or above a class, or the last one, takes at most three word scans with
//! `trailing_zeros` / `leading_zeros`, whatever the number of classes (up to 64^3).

/// Classes a bitmap can hold: three levels of 64-bit words.
pub(crate) const MAX_CLASSES: usize = 64 * 64 * 64;
const LEAVES: usize = MAX_CLASSES / 64;

/// Which classes are non-empty. Invariant: bit `c % 64` of `leaves[c / 64]` is set exactly when
/// class `c` is non-empty; bit `w % 64` of `middle[w / 64]` exactly when `leaves[w] != 0`; bit `g`
/// of `top` exactly when `middle[g] != 0`. Fixed sizes (indices masked to them) spare the bounds
/// checks; only the words in use are ever touched, so the unused tail costs no cache.
#[derive(Debug)]
pub(crate) struct ClassBitmap {
    leaves: Box<[u64; LEAVES]>,
    middle: [u64; 64],
    top: u64,
}

impl Default for ClassBitmap {
    fn default() -> Self {
        Self {
            leaves: Box::new([0; LEAVES]),
            middle: [0; 64],
            top: 0,
        }
    }
}

impl ClassBitmap {
    /// Marks `class` (below [`MAX_CLASSES`]) non-empty.
    #[inline]
    pub fn set(&mut self, class: usize) {
        let word = (class / 64) % LEAVES;
        self.leaves[word] |= 1 << (class % 64);
        self.middle[word / 64] |= 1 << (word % 64);
        self.top |= 1 << (word / 64);
    }

    /// Marks `class` (below [`MAX_CLASSES`]) empty.
    #[inline]
    pub fn clear(&mut self, class: usize) {
        let word = (class / 64) % LEAVES;
        self.leaves[word] &= !(1 << (class % 64));
        // Branch-free: whether a word emptied is data-dependent (mispredicted about a third of the
        // time in the allocator benchmark), and clearing a bit that stays set costs nothing.
        let leaf_empty = u64::from(self.leaves[word] == 0);
        self.middle[word / 64] &= !(leaf_empty << (word % 64));
        let group_empty = u64::from(self.middle[word / 64] == 0);
        self.top &= !(group_empty << (word / 64));
    }

    /// The first set class at or above `class`.
    #[inline]
    pub fn next_at_or_after(&self, class: usize) -> Option<usize> {
        let word = class / 64;
        if word >= LEAVES {
            return None;
        }
        let bits = self.leaves[word] & (u64::MAX << (class % 64));
        if bits != 0 {
            return Some(word * 64 + bits.trailing_zeros() as usize);
        }
        self.next_word_after(word)
            .map(|word| word * 64 + self.leaves[word].trailing_zeros() as usize)
    }

    /// The first non-zero leaf word after `word` (below `LEAVES`).
    fn next_word_after(&self, word: usize) -> Option<usize> {
        let word = word + 1;
        let group = word / 64;
        let bits = if group < 64 {
            self.middle[group] & (u64::MAX << (word % 64))
        } else {
            0
        };
        if bits != 0 {
            return Some(group * 64 + bits.trailing_zeros() as usize);
        }
        let groups = self.top & u64::MAX.checked_shl(group as u32 + 1).unwrap_or(0);
        if groups == 0 {
            return None;
        }
        let group = groups.trailing_zeros() as usize % 64;
        Some((group * 64 + self.middle[group].trailing_zeros() as usize) % LEAVES)
    }

    /// The last set class.
    #[inline]
    pub fn last(&self) -> Option<usize> {
        let group = 63usize.checked_sub(self.top.leading_zeros() as usize)?;
        let word = (group * 64 + 63 - self.middle[group].leading_zeros() as usize) % LEAVES;
        Some(word * 64 + 63 - self.leaves[word].leading_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn matches_an_ordered_set() {
        let classes = 66_304;
        let mut bitmap = ClassBitmap::default();
        let mut reference = BTreeSet::new();
        let mut state = 1u64;
        for _ in 0..20_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let class = ((state >> 33) as usize) % classes;
            // Cluster some classes near word boundaries and both ends.
            let class = match (state >> 20) % 4 {
                0 => class % 200,
                1 => classes - 1 - class % 200,
                _ => class,
            };
            if (state >> 10).is_multiple_of(3) {
                bitmap.clear(class);
                reference.remove(&class);
            } else {
                bitmap.set(class);
                reference.insert(class);
            }
            let probe = ((state >> 40) as usize) % classes;
            assert_eq!(
                bitmap.next_at_or_after(probe),
                reference.range(probe..).next().copied()
            );
            assert_eq!(bitmap.last(), reference.last().copied());
        }
        assert_eq!(bitmap.next_at_or_after(MAX_CLASSES), None);
        bitmap.set(MAX_CLASSES - 1);
        assert_eq!(bitmap.next_at_or_after(70_000), Some(MAX_CLASSES - 1));
        assert_eq!(bitmap.last(), Some(MAX_CLASSES - 1));
    }
}
