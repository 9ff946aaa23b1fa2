# A stand-in for the mail sender, run by tailer subscribe --exec: it reads
# one collector line at a time from its standard input and appends it to
# /out/lines. Replace it with your sender; keep reading a line only when
# done with the one before: tailer subscribe acknowledges a line once the
# next one is taken (see docs/wire-format.md, 'Consumers').
set -eu
while IFS= read -r line; do
  printf '%s\n' "$line" >>/out/lines
done
