"""The sockets: ZeroMQ transport and the TCP bulk stream, the driver that feeds a sans-I/O
``Peer`` from them (the error boundary), control messages and the client that sends them."""
