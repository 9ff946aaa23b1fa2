package traceparent

// Len is the length of a version-00 traceparent.
const Len = 55

// Valid reports whether v is a W3C traceparent of version 00:
// 00-, 32 and 16 lowercase hex digits (neither all zeros) and 2 of flags.
// Anything else is passed over, never carried: the value goes into
// message headers, rows and logs.
func Valid[T string | []byte](v T) bool {
	if len(v) != Len || v[0] != '0' || v[1] != '0' || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return false
	}
	for _, f := range [][2]int{{3, 35}, {36, 52}, {53, 55}} {
		zero := true
		for i := f[0]; i < f[1]; i++ {
			c := v[i]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
			zero = zero && c == '0'
		}
		if zero && f[1]-f[0] > 2 {
			return false
		}
	}
	return true
}
