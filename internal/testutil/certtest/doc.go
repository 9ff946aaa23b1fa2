// Package certtest makes a throwaway certificate authority, a server
// certificate for loopback and a client certificate, for tests of TLS
// connections to real servers.
//
// Test support: certificates for the TLS tests.
package certtest
