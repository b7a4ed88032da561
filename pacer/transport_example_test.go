package pacer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

// Rate-limit any HTTP client: its Transport is the pacer's. Every client in
// every process sharing the database then holds the host to 2 requests a
// second in all, slows down together on a 429 or 503, and waits out a
// Retry-After together. A request whose deadline comes before its slot
// fails at once, unsent.
func ExampleTransport() {
	ctx := context.Background()
	databaseURL, drop, err := testdb.Open() // your DATABASE_URL, with fleetpace's schema (fleetpace schema apply)
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	api, err := fakedest.New(fakedest.Config{}) // stands in for the API
	if err != nil {
		log.Fatal(err)
	}
	if err := api.Start(); err != nil {
		log.Fatal(err)
	}
	defer api.Close()

	// The platform is the host name, with its fleet-wide ceiling, once
	// (or: fleetpace platforms set 127.0.0.1 --rate 2).
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: "127.0.0.1", RatePerSec: 2}); err != nil {
		log.Fatal(err)
	}

	p, err := pacer.New(ctx, pacer.Config{DatabaseURL: databaseURL})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	client := &http.Client{Transport: &pacer.Transport{Pacer: p}}

	start := time.Now()
	for range 3 {
		resp, err := client.Get(api.URL() + "/items")
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	fmt.Println("three requests took at least 900 ms:", time.Since(start) >= 900*time.Millisecond)

	// The next slot is 500 ms away; this request may wait 100 ms.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(short, http.MethodGet, api.URL()+"/items", nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = client.Do(req)
	var wait *pacer.WaitError
	fmt.Println("no slot before the deadline:", errors.As(err, &wait), errors.Is(err, pacer.ErrNoSlot))
	fmt.Println("requests the API received:", api.Count("/items"))
	// Output:
	// 200 OK
	// 200 OK
	// 200 OK
	// three requests took at least 900 ms: true
	// no slot before the deadline: true true
	// requests the API received: 3
}
