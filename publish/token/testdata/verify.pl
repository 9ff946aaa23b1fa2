#!/usr/bin/perl
# A verifier of the tailer's tokens in another language, written from
# docs/tokens.md ("How a token is signed") alone, step by step as it says:
#
#   verify.pl KEY_HEX ACTION TOKEN [CODE]
#
# exit 0: valid; 1: not; 2: a bad argument. Uses Perl's core modules only.
use strict;
use warnings;
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(decode_base64);

my ($key_hex, $action, $token, $code) = @ARGV;
exit 2 unless defined $token && $key_hex =~ /\A[0-9a-fA-F]{64}\z/;

# 1. The key: the 32 bytes the 64 hexadecimal characters decode to.
my $key = pack('H*', $key_hex);

# 2. The token: base64url without padding, 86 characters, 64 bytes: the
# secret, then the MAC.
exit 1 unless $token =~ /\A[A-Za-z0-9_-]{86}\z/;
(my $b64 = $token) =~ tr{-_}{+/};
my $raw = decode_base64($b64 . '==');
exit 1 unless length($raw) == 64;
my ($secret, $mac) = (substr($raw, 0, 32), substr($raw, 32, 32));

# 3. The input: the action's prefix, the secret, and for
# password_recovery alone the 5 characters of the code.
my $input;
if ($action eq 'activation') {
    $input = '/activate' . $secret;
} elsif ($action eq 'password_recovery') {
    exit 1 unless defined $code && length($code) == 5;
    $input = '/recover' . $secret . $code;
} else {
    exit 2;
}

# 4. HMAC-SHA256(key, input) against the MAC, in constant time.
my $want = hmac_sha256($input, $key);
my $diff = 0;
$diff |= ord(substr($want, $_, 1)) ^ ord(substr($mac, $_, 1)) for 0 .. 31;
exit($diff == 0 ? 0 : 1);
