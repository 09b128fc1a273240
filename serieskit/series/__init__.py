"""The series itself: the pinned base, patches/, and the work tree made from them."""
