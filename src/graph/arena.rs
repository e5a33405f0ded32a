//! Arenas and typed handles.
//!
//! Tensors and operators live in [`Arena`]s and are referred to by small [`Handle`]s. A handle is
//! only meaningful for the arena that issued it; the IR never mixes handles of different graphs
//! (every threadblock graph owns its own arenas).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

/// A typed index into an [`Arena<T>`].
pub struct Handle<T> {
    index: u32,
    _marker: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// The handle of the `index`-th element of an arena.
    pub fn from_index(index: usize) -> Self {
        Handle {
            index: u32::try_from(index).expect("arena larger than u32::MAX elements"),
            _marker: PhantomData,
        }
    }

    /// The position of the element in its arena (allocation order).
    pub fn index(self) -> usize {
        self.index as usize
    }
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<T> {}
impl<T> PartialEq for Handle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index
    }
}
impl<T> Eq for Handle<T> {}
impl<T> PartialOrd for Handle<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Handle<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.index.cmp(&other.index)
    }
}
impl<T> Hash for Handle<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.index.hash(state)
    }
}
impl<T> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.index)
    }
}

/// Append-only storage; elements keep their handle for the life of the arena.
#[derive(Clone, PartialEq)]
pub struct Arena<T> {
    items: Vec<T>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena { items: Vec::new() }
    }
}

impl<T: fmt::Debug> fmt::Debug for Arena<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.items.iter().enumerate())
            .finish()
    }
}

impl<T> Arena<T> {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `value` and returns its handle.
    pub fn append(&mut self, value: T) -> Handle<T> {
        let h = Handle::from_index(self.items.len());
        self.items.push(value);
        h
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the arena is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The element behind `h`, or `None` if `h` was not issued by this arena.
    pub fn try_get(&self, h: Handle<T>) -> Option<&T> {
        self.items.get(h.index())
    }

    /// Handles and elements in allocation order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (Handle<T>, &T)> + ExactSizeIterator {
        self.items
            .iter()
            .enumerate()
            .map(|(i, t)| (Handle::from_index(i), t))
    }

    /// All handles in allocation order.
    pub fn handles(&self) -> impl DoubleEndedIterator<Item = Handle<T>> + ExactSizeIterator {
        (0..self.items.len()).map(Handle::from_index)
    }
}

impl<T> std::ops::Index<Handle<T>> for Arena<T> {
    type Output = T;
    fn index(&self, h: Handle<T>) -> &T {
        &self.items[h.index()]
    }
}

impl<T> std::ops::IndexMut<Handle<T>> for Arena<T> {
    fn index_mut(&mut self, h: Handle<T>) -> &mut T {
        &mut self.items[h.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_stable_and_typed() {
        let mut a: Arena<&str> = Arena::new();
        let x = a.append("x");
        let y = a.append("y");
        assert_eq!(a[x], "x");
        assert_eq!(a[y], "y");
        assert_eq!(y.index(), 1);
        assert!(a.try_get(Handle::from_index(2)).is_none());
        assert_eq!(a.handles().collect::<Vec<_>>(), vec![x, y]);
        assert_eq!(format!("{x:?}"), "#0");
    }
}
