# One p2p node per container. Build context: this repository.
FROM python:3.11-slim
WORKDIR /opt/p2p
COPY . .
# install.sh puts torch 2.13.0 (CPU) in place first, then p2p and its dependencies.
RUN ./install.sh
EXPOSE 7000 7001
ENTRYPOINT ["p2p"]
CMD ["start", "--listen", "0.0.0.0:7000", "--advertise", "127.0.0.1:7000"]
