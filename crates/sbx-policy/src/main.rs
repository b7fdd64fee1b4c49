fn main() {
    sbx_policy::main()
}
