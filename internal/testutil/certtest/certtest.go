package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Files are PEM files in one directory.
type Files struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// Write creates a CA named name, a server certificate for localhost and
// 127.0.0.1 and a client certificate (common name client) signed by it,
// in dir. The server certificate is good for client authentication too,
// as a NATS route's must be: a node dials the others with it.
func Write(tb testing.TB, dir, name string) Files {
	tb.Helper()
	f := Files{
		CA:         filepath.Join(dir, name+"-ca.pem"),
		ServerCert: filepath.Join(dir, name+"-server.pem"), ServerKey: filepath.Join(dir, name+"-server-key.pem"),
		ClientCert: filepath.Join(dir, name+"-client.pem"), ClientKey: filepath.Join(dir, name+"-client-key.pem"),
	}
	caKey := newKey(tb)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	writePEM(tb, f.CA, "CERTIFICATE", caDER)
	for i, leaf := range []struct {
		cert, key string
		tmpl      x509.Certificate
	}{
		{f.ServerCert, f.ServerKey, x509.Certificate{Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}},
		{f.ClientCert, f.ClientKey, x509.Certificate{Subject: pkix.Name{CommonName: "client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}},
	} {
		key := newKey(tb)
		t := leaf.tmpl
		t.SerialNumber = big.NewInt(int64(i + 2))
		t.NotBefore, t.NotAfter = ca.NotBefore, ca.NotAfter
		t.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, &t, ca, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatal(err)
		}
		writePEM(tb, leaf.cert, "CERTIFICATE", der)
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			tb.Fatal(err)
		}
		writePEM(tb, leaf.key, "EC PRIVATE KEY", keyDER)
	}
	return f
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}
