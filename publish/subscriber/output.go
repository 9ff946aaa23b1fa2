package subscriber

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/mailroom/tailer/publish/token"
)

// SeedFromOutput fills a window with the Keys of the tokens found in the
// last lines of an earlier run's output (collector lines or json lines), so
// that a restarted subscriber writing to the same file does not repeat the
// batch it wrote but could not acknowledge.
func SeedFromOutput(r io.ReaderAt, size int64, window *Dedup[string]) error {
	const maxTail = 64 << 20
	off := max(size-maxTail, 0)
	data := make([]byte, size-off)
	if _, err := r.ReadAt(data, off); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read earlier output: %w", err)
	}
	// Oldest first, so that a full window keeps the newest tokens. A last
	// line without its newline was cut short and is not trusted.
	lines := strings.Split(string(data), "\n")
	for _, line := range lines[:len(lines)-1] {
		tokens, err := DecodeLine(line)
		if err != nil {
			b, jerr := decodeJSON([]byte(line))
			if jerr != nil {
				continue
			}
			tokens = b.Tokens
		}
		for _, t := range tokens {
			if key, err := token.KeyOf(t.Token); err == nil {
				window.Seen(key)
			}
		}
	}
	return nil
}
