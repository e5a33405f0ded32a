//! Layout resolution (Z3), strides and swizzle planning. Not implemented yet: filled by the
//! planning issue.
